"""The queue under racing threads: on PostgreSQL these are real concurrent transactions (row
locks, SKIP LOCKED); on SQLite the same test checks the serialized outcome."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User
from django.db import connections, transaction

from sessions import services
from sessions.models import Run, RunEvent
from tests.sessions.conftest import EXAMPLE, publish
from workflows.models import Credential, Workflow

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

INPUTS = {"invoice": "INV-1001", "amount": "12.00"}
S = Run.Status
LIMIT = 3


def race(works: list[Callable[[], Any]]) -> list[Any]:
    """Each callable in a thread of its own, all released at the same moment; their results
    (an exception is a result, so the test sees it)."""
    barrier = threading.Barrier(len(works))
    results: list[Any] = []
    lock = threading.Lock()

    def worker(work: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            result = work()
        except Exception as exc:
            result = exc
        finally:
            connections.close_all()
        with lock:
            results.append(result)

    threads = [threading.Thread(target=worker, args=(work,)) for work in works]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    runs: list[int] = []
    lock = threading.Lock()

    def record(task: object, **kwargs: int) -> None:
        with lock:
            runs.append(kwargs["run_id"])

    monkeypatch.setattr(services.runstate, "dispatch", record)
    return runs


@pytest.fixture
def workflow(operator: User, acme_credential: Credential) -> Workflow:
    document = yaml.safe_load(EXAMPLE.read_text())
    document["settings"]["max_concurrent_runs"] = LIMIT
    return publish(operator, document)


def launch(user: User, workflow: Workflow) -> Run:
    return services.run_launch(workflow_id=workflow.pk, user=user, raw_inputs=INPUTS)


def finish(run_id: int) -> None:
    with transaction.atomic():
        locked = services.lock_run(run_id)
        services.transition(locked, S.STARTING)
        services.transition(locked, S.RUNNING)
        services.transition(locked, S.SUCCEEDED)


def occupying(workflow: Workflow) -> int:
    return Run.objects.filter(workflow=workflow).filter(services.runstate.OCCUPYING).count()


def test_racing_settles_launches_and_cancels_never_dispatch_twice_or_strand_a_slot(
    operator: User, workflow: Workflow, sent: list[int]
) -> None:
    running = [launch(operator, workflow) for _ in range(LIMIT)]
    waiting = [launch(operator, workflow) for _ in range(14)]
    assert sent == [r.pk for r in running]

    for _ in range(3):  # rounds: settles, a launch, a cancel and a release all at once
        busy = [pk for pk in sent if not Run.objects.filter(pk=pk, status__in=Run.FINAL).exists()]
        still_waiting = [r for r in waiting if Run.objects.get(pk=r.pk).waits_for_slot]
        works: list[Callable[[], Any]] = [partial(finish, pk) for pk in busy]
        works.append(lambda: launch(operator, workflow))
        last = still_waiting[-1].pk
        works.append(partial(services.run_cancel, run_id=last, user=operator))
        works.append(lambda: services.queue_release(workflow_id=workflow.pk))

        results = race(works)

        assert [r for r in results if isinstance(r, Exception)] == []
        # Every slot freed went to a waiting run, and never more than the limit.
        assert occupying(workflow) == LIMIT
        assert [pk for pk, times in Counter(sent).items() if times > 1] == []

    dispatched_events = RunEvent.objects.filter(type="dispatched").values_list("run_id", flat=True)
    assert len(dispatched_events) == len(set(dispatched_events))
    # One priority: the slots went out strictly oldest first, nobody passed over.
    created = dict(Run.objects.filter(pk__in=sent).values_list("pk", "created_at"))
    keys = [(created[pk], pk) for pk in sent]
    assert keys == sorted(keys)
