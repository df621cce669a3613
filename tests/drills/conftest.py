"""Operations drills on the real stack: PostgreSQL, Redis, Celery worker processes (prefork and
threads pools), system Chromium and the demo portal. Skipped in the embedded default."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from django.conf import settings
from django.contrib.auth.models import User

from pandaweb.demo_portal.server import PortalServer
from sessions import services
from sessions.models import Run
from tests.sessions.conftest import EXAMPLE, acme_credential, operator, publish

__all__ = ["acme_credential", "operator"]

ROOT = Path(__file__).resolve().parents[2]

# Small on purpose: each drill waits for housekeeping, never sleeps a fixed time.
HOUSEKEEPING_SECONDS = 1
REDISPATCH_AFTER_SECONDS = 3
HEARTBEAT_TIMEOUT_SECONDS = 15


@pytest.fixture(autouse=True)
def real_stack_only() -> None:
    from django.db import connection

    if settings.RUN_EXECUTION != "celery" or connection.vendor != "postgresql":
        pytest.skip("drills need PostgreSQL, Redis and Celery workers (DATABASE_URL, REDIS_URL)")


@pytest.fixture
def places(tmp_path: Path, short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Run files and sandboxes where the test process and the workers both find them (the
    sandboxes in a short directory: ``short_tmp``)."""
    found = {"runs": tmp_path / "runs", "sandboxes": short_tmp / "sandboxes"}
    monkeypatch.setattr(settings, "RUN_FILES_DIR", found["runs"])
    engine = replace(settings.ENGINE_CONFIG, sandbox_dir=found["sandboxes"])
    monkeypatch.setattr(settings, "ENGINE_CONFIG", engine)
    return found


def _database_url() -> str:
    from django.db import connection

    params = connection.settings_dict
    host, port = params.get("HOST") or "127.0.0.1", params.get("PORT") or 5432
    return f"postgresql://{params['USER']}@{host}:{port}/{params['NAME']}"


class Workers:
    """Celery worker processes on this host, each in a session of its own (a kill takes the
    whole worker, pool children included, as a machine or container kill would)."""

    def __init__(self, places: dict[str, Path], tmp_path: Path) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
        self.env |= {
            "DATABASE_URL": _database_url(),
            "DJANGO_SETTINGS_MODULE": "pandaweb.settings",
            "PANDAWEB_RUN_FILES_DIR": str(places["runs"]),
            "PANDAWEB_SANDBOX_DIR": str(places["sandboxes"]),
            "PANDAWEB_CELERY_QUEUE": settings.CELERY_TASK_DEFAULT_QUEUE,
            "PANDAWEB_HOUSEKEEPING_SECONDS": str(HOUSEKEEPING_SECONDS),
            "PANDAWEB_RUN_REDISPATCH_AFTER": str(REDISPATCH_AFTER_SECONDS),
            "PANDAWEB_RUN_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_SECONDS),
            "PYTHONUNBUFFERED": "1",
        }
        self.logs = tmp_path / "workers"
        self.logs.mkdir()
        self.running: list[subprocess.Popen[bytes]] = []
        self.started = 0

    def start(self, *, pool: str = "prefork", concurrency: int = 2) -> subprocess.Popen[bytes]:
        self.started += 1
        log = self.logs / f"worker{self.started}.log"
        queues = f"{settings.CELERY_TASK_DEFAULT_QUEUE},{services.host_queue(socket.gethostname())}"
        with open(log, "wb") as out:
            worker = subprocess.Popen(
                [
                    sys.executable, "-m", "celery", "-A", "pandaweb", "worker",
                    "--loglevel", "INFO", "--pool", pool, "--concurrency", str(concurrency),
                    "--hostname", f"drill{self.started}@%h", "--queues", queues,
                    "--without-gossip", "--without-mingle", "--without-heartbeat",
                ],
                cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        until(lambda: b"ready." in log.read_bytes(), 60, f"worker {self.started} to start", self)
        self.running.append(worker)
        return worker

    def stop_all(self, sig: int) -> None:
        """SIGTERM: the main process of each worker (a warm shutdown, as a deploy does).
        SIGKILL: every process of each worker, pool children included, at once; the sandboxes,
        in sessions of their own, are not the worker's to lose."""
        for worker in self.running:
            if sig == signal.SIGKILL:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(worker.pid, signal.SIGKILL)
            else:
                worker.send_signal(sig)
        for worker in self.running:
            worker.wait(timeout=60)
        self.running = []

    def tail(self) -> str:
        def notable(text: str) -> str:
            lines = [line for line in text.splitlines() if "WARNING" in line or "ERROR" in line]
            return "\n".join(lines[-40:])

        return "\n".join(
            f"--- {log.name}\n" + notable(log.read_text(errors="replace"))
            for log in sorted(self.logs.iterdir())
        )


def until(predicate: Callable[[], Any], timeout: float, what: str, workers: Any = None) -> Any:
    """Poll with a deadline (never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            runs = list(Run.objects.values_list("pk", "status", "failure_reason"))
            detail = f"\nruns: {runs}\n{workers.tail()}" if workers is not None else ""
            raise AssertionError(f"timed out waiting for {what}{detail}")
        time.sleep(0.1)


@pytest.fixture
def workers(places: dict[str, Path], tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(places, tmp_path)
    yield pool
    pool.stop_all(signal.SIGKILL)
    # Nothing of a drill may outlive it: cancel what is left and stop its sandboxes.
    for run in Run.objects.exclude(sandbox=None):
        if run.sandbox:
            services.destroy_sandbox(run.sandbox)


def gated_workflow(operator: User, portal: str) -> Any:
    document = yaml.safe_load(
        EXAMPLE.read_text().replace("127.0.0.1:8001", portal.removeprefix("http://"))
    )
    # The drills hold six runs at their gate at once: above the example's limit, which would
    # keep three of them waiting for a slot instead.
    document["settings"]["max_concurrent_runs"] = 10
    return publish(operator, document)


def launch(operator: User, workflow: Any, invoice: Any) -> Run:
    return services.run_launch(
        workflow_id=workflow.pk,
        user=operator,
        raw_inputs={"invoice": invoice.number, "amount": f"{invoice.amount_due:.2f}"},
    )


def open_invoices(portal_server: PortalServer, count: int) -> list[Any]:
    found = [i for i in portal_server.state.invoices() if i.status == "open"][:count]
    assert len(found) == count
    return found


def a_run_on_record(
    operator: User, portal_server: PortalServer, portal: str, workers: Workers
) -> tuple[Run, str]:
    """A gated run launched to one prefork worker, once its sandbox is on record (before the
    browser starts): the run and its sandbox's key."""
    workers.start(pool="prefork", concurrency=1)
    [invoice] = open_invoices(portal_server, 1)
    run = launch(operator, gated_workflow(operator, portal), invoice)
    record = until(
        lambda: (
            (Run.objects.get(pk=run.pk).sandbox or {}).get("pending")
            and Run.objects.get(pk=run.pk).sandbox
        ),
        60,
        "the sandbox on record",
        workers,
    )
    return run, record["run_key"]


def sandbox_processes(places: dict[str, Path], run_key: str) -> list[psutil.Process]:
    """Processes of one run's sandbox: its browser and relays (named by its workdir) and its
    egress supervisor (named by its egress directory)."""
    markers = (str(places["sandboxes"] / run_key), str(places["sandboxes"] / "egress" / run_key))
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            line = " ".join(process.info["cmdline"] or [])
            if process.info["status"] != psutil.STATUS_ZOMBIE and any(
                f"{m}/" in line or line.endswith(m) or f"{m} " in line for m in markers
            ):
                found.append(process)
        except psutil.NoSuchProcess:
            continue
    return found
