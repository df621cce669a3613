"""Where background work runs: Celery workers, or threads of this process (embedded default).

Every caller queues work the same way; ``settings.RUN_EXECUTION`` decides where it executes, so
the embedded default and the scale-out deployment run the same task code.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from celery import Task, current_app
from django.conf import settings
from django.db import connections, transaction

logger = logging.getLogger(__name__)

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def dispatch(task: Task, *, queue: str | None = None, **kwargs: Any) -> None:
    """Queue ``task(**kwargs)`` once the current transaction commits (at once outside one).

    Work must never start before the rows it reads are visible to it, hence ``on_commit``.
    ``queue`` picks a Celery queue (e.g. one worker's own); in-process it changes nothing.
    Code below the tasks layer passes ``task_named("runs.continue")`` rather than importing the
    tasks module, so no import runs from services back up to tasks.
    """
    transaction.on_commit(lambda: _send(task, kwargs, queue))


def task_named(name: str) -> Task:
    """The task registered under ``name``.

    Every app that has tasks imports its ``tasks`` module when Django starts (its
    ``AppConfig.ready``), so services queue work by name without importing the layer above them.
    """
    try:
        return current_app.tasks[name]
    except KeyError:
        raise LookupError(f"no task is registered as {name!r}") from None


def _send(task: Task, kwargs: dict[str, Any], queue: str | None) -> None:
    if settings.RUN_EXECUTION == "celery":
        if queue:
            task.apply_async(kwargs=kwargs, queue=queue)
        else:
            task.apply_async(kwargs=kwargs)
    else:
        _thread_pool().submit(_run_in_thread, task, kwargs)


def start_periodic(task: Task, *, every: float) -> threading.Thread:
    """Embedded default: run ``task`` every ``every`` seconds in this process (Celery beat's job
    in scale-out mode). Started once by the ASGI application."""

    def loop() -> None:
        while True:
            time.sleep(every)
            _run_in_thread(task, {})

    thread = threading.Thread(target=loop, name=f"periodic-{task.name}", daemon=True)
    thread.start()
    return thread


def _thread_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                max_workers=settings.RUN_THREADS, thread_name_prefix="pandaweb-run"
            )
        return _pool


def _run_in_thread(task: Task, kwargs: dict[str, Any]) -> None:
    try:
        result = task.apply(kwargs=kwargs)
        if result.failed():
            logger.error("task %s failed in-process: %r", task.name, result.result)
    finally:
        # Each pool thread has its own database connections; give them back after every task.
        for conn in connections.all(initialized_only=True):
            conn.close()
