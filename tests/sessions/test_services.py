from __future__ import annotations

import os
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from pandaweb.audit.models import AuditEvent
from sessions import services
from sessions.models import Run, StepResult
from sessions.services import execution
from tests.factories import ApprovalRequestFactory
from workflows.models import Workflow

pytestmark = pytest.mark.django_db

INPUTS = {"invoice": "INV-1001", "amount": "1,250.00"}


def test_launch_queues_a_run_with_typed_inputs_and_one_event(
    operator: User, demo_workflow: Workflow
) -> None:
    events = AuditEvent.objects.count()

    run = services.run_launch(workflow_id=demo_workflow.pk, user=operator, raw_inputs=INPUTS)

    assert run.status == Run.Status.QUEUED
    assert run.inputs == {
        "invoice": "INV-1001",
        "amount": "1250.00",
        "iban": "DE97 2004 0060 0123 4567 89",
    }
    assert run.version.number == 1
    assert list(AuditEvent.objects.values_list("action", flat=True)[events:]) == ["run.launched"]
    assert list(run.events.values_list("seq", "type")) == [(1, "status")]


def test_launch_refuses_bad_inputs_field_by_field(operator: User, demo_workflow: Workflow) -> None:
    with pytest.raises(services.RunError) as refused:
        services.run_launch(
            workflow_id=demo_workflow.pk,
            user=operator,
            raw_inputs={"invoice": "1001", "amount": "12.345", "colour": "red"},
        )

    assert refused.value.field_errors == {
        "invoice": ["must match the pattern INV-\\d{4}"],
        "amount": ["'12.345' has more than 2 decimals (if it means 12,345, write 12345.00)"],
        "__all__": ["'colour' is not a parameter of this workflow"],
    }
    assert not Run.objects.exists()


def test_one_idempotency_key_launches_one_run(operator: User, demo_workflow: Workflow) -> None:
    first, made_first = services.run_launch_once(
        workflow_id=demo_workflow.pk, user=operator, raw_inputs=INPUTS, idempotency_key="k-1"
    )
    # The same inputs as another client writes them: the rule compares typed values.
    spelled_otherwise = {**INPUTS, "amount": f" {INPUTS['amount']} "}
    second, made_second = services.run_launch_once(
        workflow_id=demo_workflow.pk,
        user=operator,
        raw_inputs=spelled_otherwise,
        idempotency_key="k-1",
    )

    assert first.pk == second.pk
    assert (made_first, made_second) == (True, False)
    assert Run.objects.count() == 1


def test_a_reused_idempotency_key_with_other_inputs_is_refused(
    operator: User, demo_workflow: Workflow
) -> None:
    services.run_launch(
        workflow_id=demo_workflow.pk, user=operator, raw_inputs=INPUTS, idempotency_key="k-1"
    )
    with pytest.raises(services.IdempotencyKeyReused, match="different launch"):
        services.run_launch(
            workflow_id=demo_workflow.pk,
            user=operator,
            raw_inputs={**INPUTS, "invoice": "INV-9999"},
            idempotency_key="k-1",
        )
    with pytest.raises(services.RunError, match="invalid idempotency key"):
        services.run_launch(
            workflow_id=demo_workflow.pk,
            user=operator,
            raw_inputs=INPUTS,
            idempotency_key="k" * 101,
        )
    assert Run.objects.count() == 1


def test_an_archived_or_unpublished_workflow_cannot_be_launched(
    operator: User, demo_workflow: Workflow
) -> None:
    demo_workflow.archived = True
    demo_workflow.save()

    with pytest.raises(services.RunError, match="archived"):
        services.run_launch(workflow_id=demo_workflow.pk, user=operator, raw_inputs=INPUTS)


def test_cancelling_a_queued_run_is_final_and_idempotent(
    operator: User, demo_workflow: Workflow
) -> None:
    run = services.run_launch(workflow_id=demo_workflow.pk, user=operator, raw_inputs=INPUTS)

    services.run_cancel(run_id=run.pk, user=operator)
    services.run_cancel(run_id=run.pk, user=operator)

    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    assert run.failure_reason == "cancelled by olivia"
    assert AuditEvent.objects.filter(action="run.cancelled").count() == 1
    # A cancelled run is never executed, even if its task arrives later.
    execution.run_execute(run_id=run.pk)
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED


def test_the_state_machine_refuses_jumps(operator: User, demo_workflow: Workflow) -> None:
    run = services.run_launch(workflow_id=demo_workflow.pk, user=operator, raw_inputs=INPUTS)

    with pytest.raises(services.TransitionRefused, match="a queued run cannot become succeeded"):
        services.transition(run, Run.Status.SUCCEEDED)


def test_the_reaper_interrupts_runs_whose_worker_went_quiet(
    operator: User, demo_workflow: Workflow
) -> None:
    run = services.run_launch(workflow_id=demo_workflow.pk, user=operator, raw_inputs=INPUTS)
    quiet = timezone.now() - timedelta(minutes=5)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, heartbeat_at=quiet)
    fresh = services.run_launch(workflow_id=demo_workflow.pk, user=operator, raw_inputs=INPUTS)
    Run.objects.filter(pk=fresh.pk).update(status=Run.Status.RUNNING, heartbeat_at=timezone.now())

    assert services.run_reap() == [run.pk]

    run.refresh_from_db()
    fresh.refresh_from_db()
    assert run.status == Run.Status.INTERRUPTED
    assert "stopped answering" in run.failure_reason
    assert fresh.status == Run.Status.RUNNING


def record_steps(run: Run, indices: range, status: str = "succeeded") -> None:
    for index in indices:
        StepResult.objects.create(
            run=run, index=index, step_id=f"s{index}", step_type="click", sentence="A step",
            status=status, started_at=timezone.now(), duration_ms=10,
        )  # fmt: skip


def step_count(run: Run) -> int:
    return len((run.version.document or {})["steps"])


def quiet_running(operator: User, workflow: Workflow) -> Run:
    run = services.run_launch(workflow_id=workflow.pk, user=operator, raw_inputs=INPUTS)
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.RUNNING,
        heartbeat_at=timezone.now() - timedelta(minutes=5),
        outputs={"receipt": "PAY-0042"},
    )
    run.refresh_from_db()
    return run


def test_the_reaper_settles_a_run_whose_every_step_was_recorded_done_as_succeeded(
    operator: User, demo_workflow: Workflow
) -> None:
    """The worker died after the last step's record and before the run's own end."""
    run = quiet_running(operator, demo_workflow)
    record_steps(run, range(step_count(run)))

    assert services.run_reap() == [run.pk]

    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    assert run.failure_reason == ""
    assert run.outputs == {"receipt": "PAY-0042"}
    settled = AuditEvent.objects.get(action="run.succeeded", run_id=run.pk)
    assert settled.extra["settled_by"] == "reaper"


def test_the_reaper_says_an_approved_action_went_through_when_later_steps_are_missing(
    operator: User, demo_workflow: Workflow
) -> None:
    run = quiet_running(operator, demo_workflow)
    steps = step_count(run)
    record_steps(run, range(steps - 2))
    now = timezone.now()
    ApprovalRequestFactory.create(
        run=run, step_index=steps - 3, status="approved", intent_at=now, completed_at=now,
        action="Click the button 'Submit payment' on http://127.0.0.1:8001/",
        action_result="Payment PAY-0042 submitted",
    )  # fmt: skip

    assert services.run_reap() == [run.pk]

    run.refresh_from_db()
    assert run.status == Run.Status.INTERRUPTED
    assert f"the approved action of step {steps - 2} went through" in run.failure_reason
    assert "Payment PAY-0042 submitted" in run.failure_reason
    assert "stopped answering" not in run.failure_reason


def test_the_reaper_does_not_call_a_run_with_a_failed_step_a_success(
    operator: User, demo_workflow: Workflow
) -> None:
    run = quiet_running(operator, demo_workflow)
    steps = step_count(run)
    record_steps(run, range(steps - 1))
    record_steps(run, range(steps - 1, steps), status="failed")

    services.run_reap()

    run.refresh_from_db()
    assert run.status == Run.Status.INTERRUPTED
    assert "stopped answering" in run.failure_reason


def test_cancelling_a_run_whose_browser_is_on_another_host_sends_the_kill_there(
    operator: User, demo_workflow: Workflow, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sessions.tasks import sandbox_destroy_task

    sent: list[dict[str, object]] = []
    monkeypatch.setattr(sandbox_destroy_task, "apply_async", lambda **kwargs: sent.append(kwargs))
    run = services.run_launch(workflow_id=demo_workflow.pk, user=operator, raw_inputs=INPUTS)
    record = {
        "backend": "local", "run_key": f"run-{run.pk}-x", "cdp_url": "http://127.0.0.1:9",
        "pid": 1, "pgid": 1, "workdir": "/nonexistent", "started_at": 0.0, "deadline": 1.0,
        "ready_seconds": 0.1, "host": "worker-host-2",
    }  # fmt: skip
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, sandbox=record)

    services.run_cancel(run_id=run.pk, user=operator)

    # The process ids and paths in the record mean something only on that machine.
    assert sent == [{"kwargs": {"sandbox": record}, "queue": "host.worker-host-2"}]
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED


def test_housekeeping_destroys_what_no_live_run_owns_and_spares_the_rest(
    operator: User, demo_workflow: Workflow, tmp_path: Path, settings: Any
) -> None:
    """From what is on disk and running, not only from rows: an egress supervisor and a browser
    left by a run that ended go; a live run's, a fresh one and another installation's stay."""
    from sessions.services.egress import egress_dir, egress_start

    settings.ENGINE_CONFIG = replace(settings.ENGINE_CONFIG, sandbox_dir=tmp_path)
    ended = services.run_launch(workflow_id=demo_workflow.pk, user=operator, raw_inputs=INPUTS)
    Run.objects.filter(pk=ended.pk).update(status=Run.Status.CANCELLED)
    live = services.run_launch(workflow_id=demo_workflow.pk, user=operator, raw_inputs=INPUTS)
    ended_key, live_key = services.sandbox_run_key(ended.pk), services.sandbox_run_key(live.pk)
    stale_key = services.sandbox_run_key(live.pk)  # an earlier start of the live run
    Run.objects.filter(pk=live.pk).update(status=Run.Status.RUNNING, sandbox={"run_key": live_key})
    foreign_key = f"run-{ended.pk}-0123abcd4567ef89"
    supervisor = egress_start(run_key=ended_key, allowed_hosts=[], deadline=time.time() + 600)
    assert supervisor.alive()
    old = time.time() - 120
    for key in (ended_key, live_key, stale_key, foreign_key):
        workdir = tmp_path / key
        workdir.mkdir()
        (workdir / ".pandaweb-sandbox").touch()
        (workdir / "deadline").write_text(repr(time.time() + 600))
        os.utime(workdir, (old, old))
    os.utime(egress_dir(ended_key), (old, old))
    young = services.sandbox_run_key(ended.pk)
    (tmp_path / young).mkdir()

    reaped = services.sandbox_reap_orphans()

    assert sorted(reaped) == sorted([ended_key, stale_key])
    assert not supervisor.alive()
    assert not egress_dir(ended_key).exists()
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != "egress")
    assert left == sorted([live_key, foreign_key, young])


def test_the_sandbox_reaper_destroys_what_outlived_its_deadline_on_this_host(
    tmp_path: Path, settings: Any
) -> None:
    settings.ENGINE_CONFIG = replace(settings.ENGINE_CONFIG, sandbox_dir=tmp_path)
    for name, deadline in (("run-1-expired", time.time() - 5), ("run-2-alive", time.time() + 600)):
        workdir = tmp_path / name
        workdir.mkdir()
        (workdir / ".pandaweb-sandbox").touch()
        (workdir / "deadline").write_text(repr(deadline))

    assert services.sandbox_reap_orphans() == ["run-1-expired"]

    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-2-alive"]
