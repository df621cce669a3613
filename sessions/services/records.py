"""The bottom of the run core: a run's row lock and its event stream, and what the records say
an interrupted run did. Everything that changes a run starts here; nothing here calls up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from approvals.models import ApprovalRequest
from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record
from sessions.events import publish_run_events
from sessions.models import Run, RunEvent, StepResult


def lock_run(run_id: int) -> Run:
    return Run.objects.select_for_update().get(pk=run_id)


def event_append(run: Run, type: str, payload: Mapping[str, Any]) -> RunEvent:
    """Append an event to a locked run (the caller saves ``run``)."""
    run.last_event_seq += 1
    event = RunEvent.objects.create(
        run=run, seq=run.last_event_seq, type=type, payload=dict(payload)
    )
    publish_run_events(run.pk, event.seq)
    return event


# What an interrupted run did ------------------------------------------------------------------


def recover_completed_actions_locked(run: Run) -> int:
    """Put on the run's timeline the approved actions whose completion was written but whose
    step record was not (the worker died in between): the portal has the payment, so the page
    must show it too. ``run`` is locked; the caller saves it. Returns how many were recovered.
    """
    recovered = 0
    done = ApprovalRequest.objects.filter(
        run=run, intent_at__isnull=False, completed_at__isnull=False
    ).order_by("step_index")
    steps = (run.version.document or {}).get("steps", [])
    for approval in done:
        if StepResult.objects.filter(run=run, index=approval.step_index).exists():
            continue
        assert approval.intent_at is not None
        assert approval.completed_at is not None
        step = steps[approval.step_index] if approval.step_index < len(steps) else {}
        evidence = approval.evidence or {}
        result = StepResult.objects.create(
            run=run,
            index=approval.step_index,
            step_id=approval.step_id,
            step_type=str(step.get("type", "")),
            sentence=approval.action,
            status=StepResult.Status.SUCCEEDED,
            started_at=approval.intent_at,
            duration_ms=max(
                0, int((approval.completed_at - approval.intent_at).total_seconds() * 1000)
            ),
            url=str(evidence.get("url", "")),
            title=str(evidence.get("title", "")),
        )
        run.steps_executed += 1
        event_append(
            run,
            "step",
            {"index": approval.step_index, "status": result.status, "step_result": result.pk},
        )
        audit_record(
            action="run.step_recovered",
            object_type="run",
            object_id=run.pk,
            team_id=run.team_id,
            actor_kind=AuditEvent.ActorKind.RUNNER,
            after={
                "step": approval.step_id,
                "index": approval.step_index,
                "status": result.status,
                "completed_at": approval.completed_at.isoformat(),
                "from": "the approved action's completion record",
            },
            run_id=run.pk,
            step_id=result.pk,
            approval_id=approval.pk,
        )
        recovered += 1
    return recovered
