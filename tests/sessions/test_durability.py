"""Runs that outlive their worker: the egress supervisor, its refusal spool, and the host's
housekeeping (adoption of waiting runs, re-sending lost work). Real supervisor processes; a
stand-in process plays the browser."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from approvals.models import ApprovalRequest
from pandaweb.audit.models import AuditEvent
from sessions import durability, services
from sessions.engine.sandbox.egress import Egress
from sessions.models import Run
from sessions.services import egress as egress_services
from tests.patching import patch_dispatch
from workflows.models import Workflow

pytestmark = pytest.mark.django_db

INPUTS = {"invoice": "INV-1001", "amount": "1,250.00"}


@pytest.fixture(autouse=True)
def sandboxes_in_tmp(settings: Any, short_tmp: Path) -> None:
    settings.ENGINE_CONFIG = replace(settings.ENGINE_CONFIG, sandbox_dir=short_tmp / "sandboxes")


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    queued: list[dict[str, Any]] = []

    def record(task: Any, queue: str | None = None, **kwargs: Any) -> None:
        queued.append({"task": task.name, "queue": queue, **kwargs})

    patch_dispatch(monkeypatch, record)
    return queued


class StandIn:
    """A process group naming the workdir on its command line, as a sandbox's browser does."""

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True)
        (workdir / ".pandaweb-sandbox").touch()
        (workdir / "deadline").write_text(repr(time.time() + 600))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)", str(workdir)],
            start_new_session=True,
        )

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def waiting(
    operator: User, demo_workflow: Workflow, short_tmp: Path
) -> Iterator[tuple[Run, Egress, StandIn]]:
    """A run waiting for approval whose worker is gone: its browser and egress supervisor live."""
    run = services.run_launch(workflow_id=demo_workflow.pk, user=operator, raw_inputs=INPUTS)
    key = f"run-{run.pk}-test"
    egress = egress_services.egress_start(
        run_key=key, allowed_hosts=["127.0.0.1:9"], deadline=time.time() + 600
    )
    workdir = short_tmp / "sandboxes" / key
    browser = StandIn(workdir)
    egress.link(str(workdir))
    record = {
        "backend": "local", "run_key": key, "cdp_url": "http://127.0.0.1:9",
        "pid": browser.proc.pid, "pgid": browser.proc.pid, "workdir": str(workdir),
        "started_at": time.time(), "deadline": time.time() + 600, "ready_seconds": 0.1,
        "host": socket.gethostname(), "run_id": run.pk, "egress_dir": str(egress.directory),
    }  # fmt: skip
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.AWAITING_APPROVAL,
        sandbox=record,
        heartbeat_at=timezone.now() - timedelta(minutes=5),
        deadline_at=timezone.now() + timedelta(minutes=10),
    )
    ApprovalRequest.objects.create(
        run=run, step_index=13, step_id="submit-payment", action="Click it",
        evidence={}, evidence_sha256="x", expires_at=timezone.now() + timedelta(hours=1),
    )  # fmt: skip
    run.refresh_from_db()
    yield run, egress, browser
    browser.kill()
    egress.stop()


def refused_by(egress: Egress, url: str) -> None:
    """The supervisor's proxy cuts a refused request like a network failure (no answer a page
    could read as success)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": egress.url}))
    with pytest.raises((ConnectionResetError, urllib.error.URLError, http.client.HTTPException)):
        opener.open(url, timeout=5)


def test_the_supervisor_refuses_what_the_policy_refuses_and_spools_it_for_any_worker(
    waiting: tuple[Run, Egress, StandIn],
) -> None:
    run, egress, _ = waiting
    refused_by(egress, "http://example.test/steal")

    assert egress_services.run_drain_egress(run_id=run.pk) == 1
    assert egress_services.run_drain_egress(run_id=run.pk) == 0  # a line is recorded once

    run.refresh_from_db()
    [denied] = run.events.filter(type="egress_denied")
    assert denied.payload["host"] == "example.test"
    assert AuditEvent.objects.filter(action="run.egress_denied", run_id=run.pk).count() == 1
    assert run.sandbox is not None
    assert run.sandbox["egress_seen"] == 1


def test_the_supervisor_outlives_no_sandbox(
    waiting: tuple[Run, Egress, StandIn], tmp_path: Path
) -> None:
    run, egress, _browser = waiting
    assert egress.alive()
    assert run.sandbox is not None
    services.destroy_sandbox(run.sandbox)

    assert not egress.alive()
    assert not egress.directory.exists()
    assert not Path(run.sandbox["workdir"]).exists()


def test_a_refusal_spooled_just_before_the_run_ends_is_recorded_before_its_last_status(
    waiting: tuple[Run, Egress, StandIn], operator: User
) -> None:
    run, egress, _ = waiting
    refused_by(egress, "http://example.test/late")

    services.run_cancel(run_id=run.pk, user=operator)

    types = list(run.events.order_by("seq").values_list("type", flat=True))
    assert types[-2:] == ["egress_denied", "status"]
    assert AuditEvent.objects.filter(action="run.egress_denied", run_id=run.pk).count() == 1


def test_housekeeping_adopts_a_waiting_run_whose_worker_is_gone_and_records_its_refusals(
    waiting: tuple[Run, Egress, StandIn],
) -> None:
    run, egress, _ = waiting
    refused_by(egress, "http://example.test/x")

    report = durability.runs_adopt_on_host()

    assert report["alive"] == [run.pk]
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    assert run.events.filter(type="egress_denied").count() == 1
    # The reaper leaves a waiting run alone whoever started it.
    assert services.run_reap(stale_after=timedelta(seconds=0)) == []


def test_housekeeping_fails_a_waiting_run_whose_browser_died_with_that_reason(
    waiting: tuple[Run, Egress, StandIn],
) -> None:
    run, egress, browser = waiting
    browser.kill()

    report = durability.runs_adopt_on_host()

    assert report["failed"] == [run.pk]
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    assert "browser sandbox was lost while it waited (its browser stopped)" in run.failure_reason
    assert run.sandbox is None
    assert run.approvals.get().status == ApprovalRequest.Status.VOIDED
    assert not egress.alive()


def test_an_approved_run_whose_continuation_was_lost_is_kept_alive_and_sent_again(
    waiting: tuple[Run, Egress, StandIn], sent: list[dict[str, Any]], settings: Any
) -> None:
    run, _, _ = waiting
    settings.RUN_REDISPATCH_AFTER_SECONDS = 30
    approval = run.approvals.get()
    decided = timezone.now() - timedelta(seconds=40)
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        status=ApprovalRequest.Status.APPROVED, decided_at=decided
    )
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)

    report = durability.runs_adopt_on_host()

    assert report["continued"] == [run.pk]
    assert sent == [
        {
            "task": "runs.continue",
            "queue": services.host_queue(socket.gethostname()),
            "run_id": run.pk,
            "approval_id": approval.pk,
        }
    ]
    # Its supervisor beats for it while the continuation waits: the reaper leaves it be.
    assert services.run_reap(stale_after=timedelta(seconds=10)) == []
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING


def test_a_queued_run_whose_message_was_lost_is_sent_again_once_per_patience(
    operator: User, demo_workflow: Workflow, sent: list[dict[str, Any]], settings: Any
) -> None:
    settings.RUN_REDISPATCH_AFTER_SECONDS = 30
    lost = services.run_launch(workflow_id=demo_workflow.pk, user=operator, raw_inputs=INPUTS)
    fresh = services.run_launch(workflow_id=demo_workflow.pk, user=operator, raw_inputs=INPUTS)
    long_ago = timezone.now() - timedelta(seconds=31)
    Run.objects.filter(pk=lost.pk).update(created_at=long_ago, dispatched_at=long_ago)
    # Waiting for a slot of its workflow is not a lost message: the queue sends it, not this.
    waiting = services.run_launch(workflow_id=demo_workflow.pk, user=operator, raw_inputs=INPUTS)
    Run.objects.filter(pk=waiting.pk).update(created_at=long_ago, dispatched_at=None)
    sent.clear()

    assert durability.runs_redispatch_queued() == [lost.pk]
    assert durability.runs_redispatch_queued() == []  # not again until the patience passes

    assert sent == [{"task": "runs.execute", "queue": None, "run_id": lost.pk}]
    fresh.refresh_from_db()
    assert fresh.status == Run.Status.QUEUED


def test_an_interrupted_run_shows_the_approved_step_whose_completion_was_written(
    operator: User, demo_workflow: Workflow, client: Any
) -> None:
    run = services.run_launch(workflow_id=demo_workflow.pk, user=operator, raw_inputs=INPUTS)
    intent = timezone.now() - timedelta(minutes=2)
    # The worker wrote the payment's completion and died before the step's own record.
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.RUNNING, heartbeat_at=timezone.now() - timedelta(minutes=1)
    )
    approval = ApprovalRequest.objects.create(
        run=run, step_index=13, step_id="submit-payment",
        action="Click the button 'Submit payment'", evidence={"url": "http://portal/pay"},
        evidence_sha256="x", status=ApprovalRequest.Status.APPROVED,
        expires_at=timezone.now() + timedelta(hours=1),
        intent_at=intent, completed_at=intent + timedelta(milliseconds=800),
    )  # fmt: skip

    assert services.run_reap(stale_after=timedelta(seconds=10)) == [run.pk]

    run.refresh_from_db()
    assert run.status == Run.Status.INTERRUPTED
    step = run.step_results.get(index=13)
    assert (step.step_id, step.status, step.duration_ms) == ("submit-payment", "succeeded", 800)
    assert step.url == "http://portal/pay"
    assert run.steps_executed == 1
    recovered = AuditEvent.objects.get(action="run.step_recovered", run_id=run.pk)
    assert recovered.approval_id == approval.pk
    client.force_login(operator)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "Click the button &#x27;Submit payment&#x27;" in page
    # Interrupting again (a second reaper) adds nothing.
    assert services.run_reap(stale_after=timedelta(seconds=0)) == []
    assert run.step_results.count() == 1
