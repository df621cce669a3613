"""Schedules (launch on a cron expression) and batches (launch the rows of a CSV file).

Both launch through ``sessions.services.run_launch``, the same service as the launch form, so
inputs are validated and audited the same way and the run is queued on commit.
"""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from pandaweb.audit.services import audit_record
from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability
from pandaweb.schedules import cron
from pandaweb.schedules.models import Batch, BatchRow, Schedule
from sessions.models import Run
from sessions.services import RunError, coerce_inputs, run_launch
from workflows.models import Workflow, WorkflowVersion
from workflows.schema import Parameter

logger = logging.getLogger(__name__)

# Runs that hold (or are about to hold) a browser: what the concurrency bound counts.
OCCUPYING = frozenset({Run.Status.QUEUED, *Run.ACTIVE})
# A tick found later than this after its time counts as missed (pandaweb was down).
MISSED_AFTER = timedelta(minutes=2)


class ScheduleError(Exception):
    def __init__(self, message: str, field_errors: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.field_errors = field_errors or {}


class BatchRefused(Exception):
    """The file was not accepted; ``problems`` say why, line by line, in the user's words."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


def _published(workflow: Workflow) -> WorkflowVersion | None:
    return (
        workflow.versions.filter(status=WorkflowVersion.Status.PUBLISHED)
        .order_by("-number")
        .first()
    )


def _parameters(version: WorkflowVersion) -> list[Parameter]:
    return [Parameter.model_validate(p) for p in (version.document or {}).get("parameters", [])]


# Schedules ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScheduleSpec:
    name: str
    cron: str
    timezone: str
    inputs: Mapping[str, Any]
    overlap: str
    missed: str


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
    version = _published(workflow)
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
            actor=user,
            after={"workflow": workflow.slug, **_schedule_facts(schedule)},
        )
    return schedule


def _lock(schedule_id: int) -> Schedule:
    return Schedule.objects.select_for_update().get(pk=schedule_id)


def schedule_update(*, schedule_id: int, user: User, spec: ScheduleSpec) -> Schedule:
    """Change a schedule; its next time is computed afresh from now. Idempotent: the same values
    write no audit event."""
    workflow = Schedule.objects.get(pk=schedule_id).workflow
    checked, inputs = _validated(workflow, spec)
    with transaction.atomic():
        schedule = _lock(schedule_id)
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
            actor=user,
            before={"paused": not paused},
            after={"paused": paused},
        )
    return schedule


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
    if not (owner.is_active and user_can(owner, Capability.LAUNCH_RUNS)):
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


# Batches -----------------------------------------------------------------------------------------


def batch_parse(
    *, version: WorkflowVersion, content: bytes
) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    """Check a whole CSV file against the version's parameters: the columns and every row.

    Returns the columns and the typed inputs of each row; raises BatchRefused listing every
    problem (never only the first), so a person fixes the file once.
    """

    if len(content) > settings.BATCH_MAX_BYTES:
        raise BatchRefused(
            f"The file is larger than {settings.BATCH_MAX_BYTES // 1000} kB; "
            "split it into smaller files."
        )
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise BatchRefused(
            "The file is not UTF-8 text. In your spreadsheet, save it as “CSV UTF-8”."
        ) from None
    if not text.strip():
        raise BatchRefused("The file is empty: it needs a header line and at least one row.")
    try:
        dialect: Any = csv.Sniffer().sniff(text.split("\n", 1)[0], delimiters=",;\t")
    except csv.Error:
        dialect = csv.excel
    reader = csv.reader(io.StringIO(text, newline=""), dialect, strict=True)
    try:
        lines = list(reader)
    except csv.Error as exc:
        raise BatchRefused(
            f"Line {reader.line_num}: this is not readable CSV ({exc}); look for a quote "
            "that is never closed."
        ) from None
    header = [h.strip() for h in lines[0]]
    parameters = {p.name: p for p in _parameters(version)}
    problems: list[str] = []
    duplicates = sorted({h for h in header if header.count(h) > 1})
    if duplicates:
        problems.append(f"Columns appear twice: {', '.join(duplicates)}.")
    extra = [h for h in header if h not in parameters]
    if extra:
        problems.append(
            f"Unknown columns: {', '.join(extra) or '(blank)'}. "
            f"This workflow's parameters are: {', '.join(parameters) or 'none'}."
        )
    missing = [
        name
        for name, p in parameters.items()
        if name not in header and p.required and p.default is None
    ]
    if missing:
        problems.append(f"Missing columns for required parameters: {', '.join(missing)}.")
    if problems:
        raise BatchRefused("The columns do not match the workflow's parameters.", problems)
    body = [
        (number, row)
        for number, row in enumerate(lines[1:], start=2)
        if any(c.strip() for c in row)
    ]
    if not body:
        raise BatchRefused("The file has a header line but no rows to launch.")
    if len(body) > settings.BATCH_MAX_ROWS:
        raise BatchRefused(
            f"The file has {len(body)} rows; one batch takes at most {settings.BATCH_MAX_ROWS}."
        )
    rows: list[tuple[int, dict[str, Any]]] = []
    for line, row in body:
        if len(row) != len(header):
            problems.append(f"Line {line}: has {len(row)} cells, the header has {len(header)}.")
            continue
        try:
            rows.append((line, coerce_inputs(version, dict(zip(header, row, strict=True)))))
        except RunError as exc:
            for field, messages in exc.field_errors.items():
                where = f"Line {line}, {field}" if field in parameters else f"Line {line}"
                problems.extend(f"{where}: {message}" for message in messages)
    if problems:
        count = "1 problem" if len(problems) == 1 else f"{len(problems)} problems"
        raise BatchRefused(f"{count} in the file; nothing was launched.", problems)
    return header, rows


def batch_create(*, workflow_id: int, user: User, filename: str, content: bytes) -> Batch:
    """Check every row, then save the batch and launch every row: the workflow's queue keeps at
    most its concurrency limit going, the others wait in file order. Nothing is saved on any
    error. Not idempotent: each upload is a new batch."""
    workflow = Workflow.objects.get(pk=workflow_id)
    if workflow.archived:
        raise BatchRefused("This workflow is archived.")
    version = _published(workflow)
    if version is None:
        raise BatchRefused("Publish a version of this workflow before launching a batch.")
    columns, rows = batch_parse(version=version, content=content)
    with transaction.atomic():
        batch = Batch.objects.create(
            workflow=workflow,
            version_number=version.number or 0,
            filename=filename[:255],
            columns=columns,
            created_by=user,
        )
        BatchRow.objects.bulk_create(
            BatchRow(batch=batch, line=line, inputs=inputs) for line, inputs in rows
        )
        audit_record(
            action="batch.created",
            object_type="batch",
            object_id=batch.pk,
            actor=user,
            after={
                "workflow": workflow.slug,
                "version": version.number,
                "filename": batch.filename,
                "rows": len(rows),
            },
        )
        batch_release(workflow_id=workflow.pk)
    return batch


def batch_release(*, workflow_id: int) -> list[int]:
    """Launch the waiting rows of a workflow's batches, oldest batch and first line first; their
    runs join the workflow's queue (sessions' ``queue_release`` bounds what runs at once).
    Returns the rows launched. Idempotent, and safe from several processes: rows are taken with
    SKIP LOCKED and each launch carries an idempotency key of its batch and line."""

    launched: list[int] = []
    with transaction.atomic():
        waiting = (
            BatchRow.objects.select_for_update(of=("self",), skip_locked=True)
            .filter(batch__workflow_id=workflow_id, status=BatchRow.Status.WAITING)
            .select_related("batch", "batch__created_by")
            .order_by("batch_id", "line")
        )
        for row in waiting:
            try:
                run = run_launch(
                    workflow_id=workflow_id,
                    user=row.batch.created_by,
                    raw_inputs=row.inputs,
                    idempotency_key=f"batch-{row.batch_id}-line-{row.line}",
                )
            except RunError as exc:
                row.status, row.error = BatchRow.Status.REFUSED, str(exc)[:500]
            else:
                row.status, row.run = BatchRow.Status.LAUNCHED, run
                launched.append(row.pk)
            row.launched_at = timezone.now()
            row.save(update_fields=["status", "run", "error", "launched_at"])
    return launched


def batches_release_all() -> None:
    """The safety net run with the schedule tick: launch rows still waiting (saved by a version
    of pandaweb that held them back itself, or whose batch's transaction was cut short)."""
    for workflow_id in (
        BatchRow.objects.filter(status=BatchRow.Status.WAITING)
        .order_by()
        .values_list("batch__workflow_id", flat=True)
        .distinct()
    ):
        batch_release(workflow_id=workflow_id)


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_safe(value: Any) -> str:
    """A cell a spreadsheet shows as text: a leading =, +, -, @ would make it a formula."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(_FORMULA_START) else text


def batch_outputs_csv(batch: Batch) -> str:
    rows = list(batch.rows.select_related("run"))
    # Alphabetical: PostgreSQL's jsonb keeps no key order, and the file must not depend on it.
    output_names = sorted(
        {name for row in rows for name in ((row.run.outputs if row.run else {}) or {})}
    )
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["line", "run", "status", *batch.columns, *output_names, "failure_reason"])
    for row in rows:
        run = row.run
        status = run.status if run else row.status
        outputs = (run.outputs if run else {}) or {}
        writer.writerow(
            [
                row.line,
                run.pk if run else "",
                status,
                *(csv_safe(row.inputs.get(c)) for c in batch.columns),
                *(csv_safe(outputs.get(n)) for n in output_names),
                csv_safe(run.failure_reason if run else row.error),
            ]
        )
    return buffer.getvalue()
