"""Drills: what happens to runs when their workers stop (a deploy, a crash, an OOM kill)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User

from approvals import services as approvals
from approvals.models import ApprovalRequest
from pandaweb.demo_portal.server import PortalServer
from sessions.models import Run
from tests.demo_portal.conftest import fetch_json
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
from tests.sessions.conftest import EXAMPLE, publish
from workflows.models import Credential

pytestmark = [
    pytest.mark.browser,
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

S = Run.Status


def statuses(runs: list[Run]) -> list[str]:
    return [Run.objects.get(pk=run.pk).status for run in runs]


def record_of(run: Run) -> dict[str, Any]:
    record = Run.objects.get(pk=run.pk).sandbox
    assert record is not None
    return dict(record)


def approve(run: Run, reviewer: User) -> None:
    approval = ApprovalRequest.objects.get(run=run, status=ApprovalRequest.Status.PENDING)
    approvals.approval_decide(
        approval_id=approval.pk,
        user=reviewer,
        approve=True,
        evidence_sha256=approval.evidence_sha256,
    )


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_runs_waiting_for_approval_survive_a_restart_of_every_worker_and_pay_once(
    stop: signal.Signals,
    operator: User,
    acme_credential: Credential,
    reviewer: User,
    portal_server: PortalServer,
    portal: str,
    places: dict[str, Path],
    workers: Workers,
) -> None:
    # Both pools: a run started in a prefork child continues in another process entirely.
    workers.start(pool="prefork", concurrency=3)
    workers.start(pool="threads", concurrency=3)
    workflow = gated_workflow(operator, portal)
    *paying, doomed = open_invoices(portal_server, 6)
    runs = [launch(operator, workflow, invoice) for invoice in paying]
    lost = launch(operator, workflow, doomed)
    until(
        lambda: set(statuses([*runs, lost])) == {S.AWAITING_APPROVAL},
        90,
        "six runs at their gate",
        workers,
    )
    keys = {run.pk: record_of(run)["run_key"] for run in [*runs, lost]}

    workers.stop_all(stop)

    # The browsers and their egress supervisors outlived every worker.
    for run in [*runs, lost]:
        assert len(sandbox_processes(places, keys[run.pk])) >= 2, run.pk
    # One browser dies while no worker is up (an OOM kill of Chromium, say).
    os.killpg(record_of(lost)["pgid"], signal.SIGKILL)

    workers.start(pool="prefork", concurrency=2)
    workers.start(pool="threads", concurrency=2)
    # The new workers' housekeeping ends the run whose browser died, with that reason.
    until(lambda: statuses([lost]) == [S.FAILED], 10 * HOUSEKEEPING_SECONDS, "the lost run")
    lost.refresh_from_db()
    assert "browser sandbox was lost while it waited" in lost.failure_reason
    until(lambda: not sandbox_processes(places, keys[lost.pk]), 10, "the lost run's processes")

    for run in runs:
        approve(run, reviewer)
    until(
        lambda: statuses(runs) == [S.SUCCEEDED] * 5,
        180,
        "five runs to finish after their approval",
        workers,
    )
    payments = fetch_json(f"{portal}/api/payments")
    assert sorted(p["invoice"] for p in payments) == sorted(i.number for i in paying)
    for run in runs:
        approval = ApprovalRequest.objects.get(run=run, status=ApprovalRequest.Status.APPROVED)
        assert approval.intent_at is not None
        assert approval.completed_at is not None
        key = keys[run.pk]
        until(lambda key=key: not sandbox_processes(places, key), 10, "clean-up")  # type: ignore[misc]


def test_a_worker_killed_inside_the_approved_payment_leaves_it_for_reconciliation_never_twice(
    operator: User,
    acme_credential: Credential,
    reviewer: User,
    portal_server: PortalServer,
    portal: str,
    places: dict[str, Path],
    workers: Workers,
) -> None:
    workers.start(pool="prefork", concurrency=1)
    [invoice] = open_invoices(portal_server, 1)
    run = launch(operator, gated_workflow(operator, portal), invoice)
    until(lambda: statuses([run]) == [S.AWAITING_APPROVAL], 120, "the gate", workers)
    key = record_of(run)["run_key"]
    # The portal records the payment at once but answers late: the worker dies in between.
    portal_server.slow_paths = {r"/pay/submit$": 30.0}

    approve(run, reviewer)
    until(lambda: portal_server.state.payments(), 60, "the payment", workers)
    workers.stop_all(signal.SIGKILL)
    workers.start(pool="prefork", concurrency=1)

    until(lambda: statuses([run]) == [S.NEEDS_RECONCILIATION], 30, "the reaper", workers)
    run.refresh_from_db()
    assert "may have happened" in run.failure_reason
    until(lambda: not sandbox_processes(places, key), 10, "the run's processes")
    # Nothing retried the payment.
    assert len(fetch_json(f"{portal}/api/payments")) == 1
    approval = ApprovalRequest.objects.get(run=run, status=ApprovalRequest.Status.APPROVED)
    assert approval.intent_at is not None
    assert approval.completed_at is None


def test_a_worker_killed_after_the_payment_went_through_says_it_went_through(
    operator: User,
    acme_credential: Credential,
    reviewer: User,
    portal_server: PortalServer,
    portal: str,
    places: dict[str, Path],
    workers: Workers,
) -> None:
    """The reaper settles from the record: the payment completed, a later step never ran; the
    run must not end as a plain "interrupted" that reads like "not paid"."""
    workers.start(pool="prefork", concurrency=1)
    [invoice] = open_invoices(portal_server, 1)
    document = yaml.safe_load(
        EXAMPLE.read_text().replace("127.0.0.1:8001", portal.removeprefix("http://"))
    )
    # A last step that takes its time: the worker dies while it runs, after the payment.
    document["steps"].append(
        {"id": "linger", "type": "wait_for", "text": "never on the page", "timeout_ms": 120000}
    )
    run = launch(operator, publish(operator, document), invoice)
    until(lambda: statuses([run]) == [S.AWAITING_APPROVAL], 120, "the gate", workers)
    key = record_of(run)["run_key"]

    approve(run, reviewer)
    until(
        lambda: run.step_results.filter(step_id="check-receipt").exists(),
        90,
        "the steps after the payment",
        workers,
    )
    workers.stop_all(signal.SIGKILL)
    workers.start(pool="prefork", concurrency=1)

    until(lambda: statuses([run]) == [S.INTERRUPTED], 60, "the reaper", workers)
    run.refresh_from_db()
    assert "went through" in run.failure_reason
    assert "Submit payment" in run.failure_reason
    assert len(fetch_json(f"{portal}/api/payments")) == 1
    until(lambda: not sandbox_processes(places, key), 30, "the run's processes", workers)


def test_a_killed_worker_loses_no_queued_run_and_leaves_no_sandbox_behind(
    operator: User,
    acme_credential: Credential,
    portal_server: PortalServer,
    portal: str,
    places: dict[str, Path],
    workers: Workers,
) -> None:
    workers.start(pool="prefork", concurrency=2)
    workflow = gated_workflow(operator, portal)
    runs = [launch(operator, workflow, invoice) for invoice in open_invoices(portal_server, 4)]
    # Two execute; the other two messages sit prefetched in the same worker.
    until(
        lambda: (
            sorted(statuses(runs)).count(S.QUEUED) == 2
            and all(
                r.sandbox and not r.sandbox.get("pending")
                for r in Run.objects.filter(pk__in=[x.pk for x in runs], status=S.RUNNING)
            )
            and Run.objects.filter(pk__in=[x.pk for x in runs], status=S.RUNNING).count() == 2
        ),
        120,
        "two running, two queued",
        workers,
    )
    executing = list(Run.objects.filter(pk__in=[r.pk for r in runs], status=S.RUNNING))
    queued = [r for r in runs if r.pk not in {e.pk for e in executing}]
    keys = [record_of(r)["run_key"] for r in executing]
    assert all(sandbox_processes(places, key) for key in keys)

    workers.stop_all(signal.SIGKILL)
    workers.start(pool="threads", concurrency=2)

    # The database is the queue of record: the lost messages are sent again and both start.
    until(lambda: all(s != S.QUEUED for s in statuses(queued)), 60, "the queued runs", workers)
    # The two whose worker died end interrupted, and their sandboxes go within a period.
    until(lambda: statuses(executing) == [S.INTERRUPTED] * 2, 30, "the reaper", workers)
    for key in keys:
        until(lambda key=key: not sandbox_processes(places, key), 10 * HOUSEKEEPING_SECONDS, key)  # type: ignore[misc]
    for run in queued:
        started = Run.objects.get(pk=run.pk)
        assert started.started_at is not None
        # Started once: one status event per state, never a second "starting".
        assert started.events.filter(type="status", payload__to=S.STARTING).count() == 1


def test_a_worker_killed_while_the_browser_starts_leaves_no_browser_behind(
    operator: User,
    acme_credential: Credential,
    portal_server: PortalServer,
    portal: str,
    places: dict[str, Path],
    workers: Workers,
) -> None:
    # The sandbox is on record before the browser starts.
    run, key = a_run_on_record(operator, portal_server, portal, workers)
    until(lambda: sandbox_processes(places, key), 30, "the sandbox starting", workers)
    workers.stop_all(signal.SIGKILL)
    workers.start(pool="threads", concurrency=1)

    until(lambda: statuses([run]) == [S.INTERRUPTED], 30, "the reaper", workers)
    until(lambda: not sandbox_processes(places, key), 10 * HOUSEKEEPING_SECONDS, "clean-up")
    # It was killed while starting: it never ran.
    assert not run.events.filter(type="status", payload__to=S.RUNNING).exists()
