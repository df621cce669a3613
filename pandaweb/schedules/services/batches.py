"""Batches: launch one run per row of a CSV file, through ``sessions.services.run_launch`` (the
launch form's service, so inputs are validated and audited the same way)."""

from __future__ import annotations

import csv
import io
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from pandaweb.audit.services import audit_record
from pandaweb.schedules.models import Batch, BatchRow
from pandaweb.schedules.services.versions import parameters_of, published_version
from sessions.services import RunError, coerce_inputs, run_launch
from workflows.models import Workflow, WorkflowVersion


class BatchRefused(Exception):
    """The file was not accepted; ``problems`` say why, line by line, in the user's words."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


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
    parameters = {p.name: p for p in parameters_of(version)}
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
    version = published_version(workflow)
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
