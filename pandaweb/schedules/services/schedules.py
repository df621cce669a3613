"""Schedules: launch a workflow on a cron expression, through ``sessions.services.run_launch``
(the launch form's service, so inputs are validated and audited the same way)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from pandaweb.audit.services import audit_record
from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability
from pandaweb.schedules import cron
from pandaweb.schedules.models import Schedule
from pandaweb.schedules.services.versions import published_version
from sessions.models import Run
from sessions.services import RunError, coerce_inputs, run_launch
from workflows.models import Workflow

# Runs that hold (or are about to hold) a browser: what the concurrency bound counts.
OCCUPYING = frozenset({Run.Status.QUEUED, *Run.ACTIVE})
# A tick found later than this after its time counts as missed (pandaweb was down).
MISSED_AFTER = timedelta(minutes=2)


class ScheduleError(Exception):
    def __init__(self, message: str, field_errors: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.field_errors = field_errors or {}


@dataclass(frozen=True)
class ScheduleSpec:
    name: str
    cron: str
    timezone: str
    inputs: Mapping[str, Any]
    overlap: str
    missed: str


def _refuse_outside_team(user: User, workflow: Workflow) -> None:
    """Who schedules a workflow's runs launches them: LAUNCH_RUNS in its team (run_launch asks
    again at every firing)."""
    if not user_can(user, Capability.LAUNCH_RUNS, team_id=workflow.team_id):
        raise ScheduleError(f"you may not schedule runs of {workflow.team}'s workflows")


def _validated(workflow: Workflow, spec: ScheduleSpec) -> tuple[ScheduleSpec, dict[str, Any]]:
    errors: dict[str, list[str]] = {}
    name = spec.name.strip()
    if not name:
        errors["name"] = ["Give the schedule a name."]
    expression = spec.cron
    try:
        expression = cron.check(spec.cron)
    except cron.CronError as exc:
        errors["cron"] = [str(exc)]
    try:
        cron.zone(spec.timezone)
    except cron.CronError as exc:
        errors["timezone"] = [str(exc)]
    if spec.overlap not in Schedule.Overlap.values:
        errors["overlap"] = ["Choose what happens while the previous run is still active."]
    if spec.missed not in Schedule.Missed.values:
        errors["missed"] = ["Choose what happens to ticks missed while pandaweb was down."]
    version = published_version(workflow)
    inputs: dict[str, Any] = {}
    if version is None:
        errors.setdefault("__all__", []).append("Publish a version of this workflow first.")
    else:
        try:
            inputs = coerce_inputs(version, spec.inputs)
        except RunError as exc:
            for field, messages in exc.field_errors.items():
                errors.setdefault(field, []).extend(messages)
    if errors:
        raise ScheduleError("the schedule is not valid", errors)
    return (
        ScheduleSpec(name, expression, spec.timezone, inputs, spec.overlap, spec.missed),
        inputs,
    )


def _next_fire(schedule: Schedule, after: datetime) -> datetime:
    return cron.next_times(schedule.cron, schedule.timezone, after, 1)[0]


def _schedule_facts(schedule: Schedule) -> dict[str, Any]:
    return {
        "name": schedule.name,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "inputs": dict(schedule.inputs),
        "overlap": schedule.overlap,
        "missed": schedule.missed,
        "paused": schedule.paused,
    }


def schedule_create(*, workflow_id: int, user: User, spec: ScheduleSpec) -> Schedule:
    """Make a schedule that launches as ``user``. Inputs are checked like the launch form's.
    Not idempotent."""
    workflow = Workflow.objects.get(pk=workflow_id)
    _refuse_outside_team(user, workflow)
    checked, inputs = _validated(workflow, spec)
    with transaction.atomic():
        schedule = Schedule(
            workflow=workflow,
            name=checked.name,
            cron=checked.cron,
            timezone=checked.timezone,
            inputs=inputs,
            overlap=checked.overlap,
            missed=checked.missed,
            owner=user,
        )
        schedule.next_fire_at = _next_fire(schedule, timezone.now())
        schedule.save()
        audit_record(
            action="schedule.created",
            object_type="schedule",
            object_id=schedule.pk,
            team_id=workflow.team_id,
            actor=user,
            after={"workflow": workflow.slug, **_schedule_facts(schedule)},
        )
    return schedule


def _lock(schedule_id: int) -> Schedule:
    return Schedule.objects.select_for_update().get(pk=schedule_id)


def schedule_update(*, schedule_id: int, user: User, spec: ScheduleSpec) -> Schedule:
    """Change a schedule; its next time is computed afresh from now. Idempotent: the same values
    write no audit event."""
    with transaction.atomic():
        schedule = _lock(schedule_id)
        _refuse_outside_team(user, schedule.workflow)
        checked, inputs = _validated(schedule.workflow, spec)
        before = _schedule_facts(schedule)
        schedule.name, schedule.cron, schedule.timezone = (
            checked.name,
            checked.cron,
            checked.timezone,
        )
        schedule.inputs, schedule.overlap, schedule.missed = inputs, checked.overlap, checked.missed
        after = _schedule_facts(schedule)
        if after == before:
            return schedule
        # Whoever sets the inputs is who the runs launch as: nobody launches in another's name.
        before["owner"], after["owner"] = schedule.owner.get_username(), user.get_username()
        schedule.owner = user
        schedule.next_fire_at = _next_fire(schedule, timezone.now())
        schedule.save()
        audit_record(
            action="schedule.updated",
            object_type="schedule",
            object_id=schedule.pk,
            team_id=schedule.workflow.team_id,
            actor=user,
            before=before,
            after=after,
        )
    return schedule


def schedule_set_paused(*, schedule_id: int, user: User, paused: bool) -> Schedule:
    """Pause or resume. Resuming starts from the next tick after now: nothing paused over is
    replayed. Idempotent."""
    with transaction.atomic():
        schedule = _lock(schedule_id)
        _refuse_outside_team(user, schedule.workflow)
        if schedule.paused == paused:
            return schedule
        schedule.paused = paused
        schedule.queued_at = None
        schedule.next_fire_at = None if paused else _next_fire(schedule, timezone.now())
        schedule.save()
        audit_record(
            action="schedule.paused" if paused else "schedule.resumed",
            object_type="schedule",
            object_id=schedule.pk,
            team_id=schedule.workflow.team_id,
            actor=user,
            before={"paused": not paused},
            after={"paused": paused},
        )
    return schedule


def schedule_delete(*, schedule_id: int, user: User) -> None:
    """Delete a schedule: it launches nothing more; the runs it launched stay. The audit event
    keeps what it was. Raises ``Schedule.DoesNotExist`` when it is gone already."""
    with transaction.atomic():
        schedule = _lock(schedule_id)
        _refuse_outside_team(user, schedule.workflow)
        before = {"workflow": schedule.workflow.slug, **_schedule_facts(schedule)}
        schedule.delete()
        audit_record(
            action="schedule.deleted",
            object_type="schedule",
            object_id=schedule_id,
            team_id=schedule.workflow.team_id,
            actor=user,
            before=before,
        )


def _previous_active(schedule: Schedule) -> bool:
    if schedule.last_run_id is None:
        return False
    status = Run.objects.filter(pk=schedule.last_run_id).values_list("status", flat=True).first()
    return status in OCCUPYING


def schedule_fire(*, schedule_id: int, now: datetime | None = None) -> str | None:
    """Fire a due schedule once; returns what happened, or None when it was not due or another
    scheduler claimed this tick first. Safe to call from several processes at once."""
    now = now or timezone.now()
    schedule = Schedule.objects.get(pk=schedule_id)
    due = schedule.next_fire_at
    if schedule.paused or due is None or due > now:
        return None
    # The next time counts from now, not from the missed tick: after downtime the ticks in
    # between are never replayed one by one.
    following = _next_fire(schedule, now)
    claimed = Schedule.objects.filter(pk=schedule_id, paused=False, next_fire_at=due).update(
        next_fire_at=following, last_fired_at=now
    )
    if claimed != 1:
        return None
    if now - due > MISSED_AFTER and schedule.missed == Schedule.Missed.SKIP:
        return _outcome(
            schedule, f"skipped the tick of {due:%Y-%m-%d %H:%M} UTC: missed while down"
        )
    if _previous_active(schedule):
        if schedule.overlap == Schedule.Overlap.QUEUE_ONE:
            queued = Schedule.objects.filter(pk=schedule_id, queued_at__isnull=True).update(
                queued_at=now
            )
            if queued:
                return _outcome(schedule, "queued: starts when the previous run ends")
            return _outcome(schedule, "skipped: one run is already queued behind the active one")
        return _outcome(schedule, "skipped: the previous run is still active")
    return _launch(schedule, key=f"schedule-{schedule.pk}-{due:%Y%m%dT%H%M}")


def _outcome(schedule: Schedule, text: str) -> str:
    Schedule.objects.filter(pk=schedule.pk).update(last_outcome=text[:500])
    return text


def _launch(schedule: Schedule, *, key: str) -> str:
    owner = schedule.owner
    if not (
        owner.is_active
        and user_can(owner, Capability.LAUNCH_RUNS, team_id=schedule.workflow.team_id)
    ):
        refusal = f"not launched: {owner.get_username()} may no longer launch runs"
    else:
        try:
            run = run_launch(
                workflow_id=schedule.workflow_id,
                user=owner,
                raw_inputs=dict(schedule.inputs),
                idempotency_key=key,
            )
        except RunError as exc:
            details = "; ".join(f"{k}: {', '.join(v)}" for k, v in exc.field_errors.items())
            refusal = f"not launched: {exc}" + (f" ({details})" if details else "")
        else:
            Schedule.objects.filter(pk=schedule.pk).update(
                last_run=run, queued_at=None, last_outcome=f"launched run #{run.pk}"
            )
            return f"launched run #{run.pk}"
    with transaction.atomic():
        audit_record(
            action="schedule.launch_refused",
            object_type="schedule",
            object_id=schedule.pk,
            team_id=schedule.workflow.team_id,
            after={"reason": refusal},
        )
    return _outcome(schedule, refusal)


def schedules_tick(*, now: datetime | None = None) -> dict[int, str]:
    """Fire what is due and start what was queued behind a finished run. Run by the
    housekeeping thread (embedded) or Celery beat (scale-out); any number may run at once."""
    now = now or timezone.now()
    done: dict[int, str] = {}
    for schedule_id in Schedule.objects.filter(paused=False, next_fire_at__lte=now).values_list(
        "pk", flat=True
    ):
        outcome = schedule_fire(schedule_id=schedule_id, now=now)
        if outcome is not None:
            done[schedule_id] = outcome
    for schedule in Schedule.objects.filter(paused=False, queued_at__isnull=False):
        if _previous_active(schedule):
            continue
        # Claim the queued run: only the process that clears queued_at launches it.
        if Schedule.objects.filter(pk=schedule.pk, queued_at=schedule.queued_at).update(
            queued_at=None
        ):
            done[schedule.pk] = _launch(
                schedule, key=f"schedule-{schedule.pk}-queued-{schedule.queued_at:%Y%m%dT%H%M%S}"
            )
    return done
