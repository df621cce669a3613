"""Drills at a sandbox's edges with real Celery workers: who may drive a waiting run's browser,
and what a cancel during the start leaves behind."""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User

from pandaweb.demo_portal.server import PortalServer
from sessions import services
from sessions.engine.sandbox import namespaces
from sessions.engine.sandbox.workdirs import json_version
from sessions.models import Run
from tests.drills.conftest import (
    HOUSEKEEPING_SECONDS,
    Workers,
    a_run_on_record,
    gated_workflow,
    launch,
    open_invoices,
    sandbox_processes,
    until,
)
from workflows.models import Credential

pytestmark = [
    pytest.mark.browser,
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

S = Run.Status


def plain_get(port: int, target: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def start_finished(workers: Workers) -> bool:
    """Whether a worker has returned from the run's execute task (Celery logs its end)."""
    for log in workers.logs.iterdir():
        for line in log.read_text(errors="replace").splitlines():
            if "Task runs.execute[" in line and ("succeeded in" in line or "raised" in line):
                return True
    return False


@pytest.mark.skipif(not namespaces.probe().usable, reason="no namespaces on this host")
def test_a_waiting_runs_browser_answers_its_workers_and_nobody_else(
    operator: User,
    acme_credential: Credential,
    portal_server: PortalServer,
    portal: str,
    places: dict[str, Path],
    workers: Workers,
) -> None:
    workers.start(pool="threads", concurrency=2)
    [invoice] = open_invoices(portal_server, 1)
    run = launch(operator, gated_workflow(operator, portal), invoice)
    until(lambda: Run.objects.get(pk=run.pk).status == S.AWAITING_APPROVAL, 90, "the gate", workers)
    cdp_url = (Run.objects.get(pk=run.pk).sandbox or {})["cdp_url"]
    port = urlsplit(cdp_url).port
    assert port is not None

    # The run's own address (what any worker that continues it reads from the row) works.
    assert json_version(cdp_url, timeout=5) is not None
    # Another process on the host, with the port but not the secret, gets nothing.
    for target in ("/json/version", "/json/list", "/json/new?about:blank"):
        answer = plain_get(port, target)
        assert answer.startswith(b"HTTP/1.1 403 "), answer[:200]
        assert b"devtools" not in answer
    services.run_cancel(run_id=run.pk, user=operator)


@pytest.mark.parametrize("moment", ["once on record", "while the browser starts"])
def test_a_run_cancelled_while_its_worker_starts_it_leaves_nothing_running(
    moment: str,
    operator: User,
    acme_credential: Credential,
    portal_server: PortalServer,
    portal: str,
    places: dict[str, Path],
    workers: Workers,
) -> None:
    run, key = a_run_on_record(operator, portal_server, portal, workers)
    if moment == "while the browser starts":
        until(lambda: sandbox_processes(places, key), 30, "the sandbox starting", workers)

    services.run_cancel(run_id=run.pk, user=operator)

    assert Run.objects.get(pk=run.pk).status == S.CANCELLED
    # The worker finishes its start, finds the run cancelled and destroys what it made (before,
    # a FileNotFoundError left the browser running until its deadline). Judged once the worker
    # is done with the run.
    until(lambda: start_finished(workers), 60, "the worker to finish the start", workers)
    # Its processes go first, then its directory: judged once both are gone.
    until(
        lambda: not sandbox_processes(places, key) and not (places["sandboxes"] / key).exists(),
        10 * HOUSEKEEPING_SECONDS,
        "nothing of the start left running",
        workers,
    )
    assert not (places["sandboxes"] / key).exists()
    assert not (places["sandboxes"] / "egress" / key).exists()
