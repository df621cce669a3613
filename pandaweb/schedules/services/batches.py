"""Batches: launch one run per row of a CSV file, through ``sessions.services.run_launch`` (the
launch form's service, so inputs are validated and audited the same way)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from pandaweb.audit.services import audit_record
from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability
from pandaweb.schedules.models import Batch, BatchRow
from pandaweb.schedules.services.versions import parameters_of, published_version
from sessions.services import IdempotencyKeyReused, RunError, coerce_inputs, run_launch
from workflows.models import Workflow, WorkflowVersion


@dataclass(frozen=True)
class RowProblem:
    """One thing wrong with one row. ``row`` as people count it: the file's line (the header is
    line 1), or the row's position in a list of rows (the first is 1); ``field`` the parameter
    (the column), "" for the row as a whole."""

    row: int
    field: str
    message: str

    def __str__(self) -> str:
        where = f"Line {self.row}, {self.field}" if self.field else f"Line {self.row}"
        return f"{where}: {self.message}"


class BatchRefused(Exception):
    """The rows were not accepted; ``problems`` say why, line by line, in the user's words, and
    ``rows`` holds the problems of single rows as data (empty when the file as a whole was
    refused: its size, its encoding, its columns)."""

    def __init__(
        self,
        message: str,
        problems: list[str] | None = None,
        *,
        rows: list[RowProblem] | None = None,
    ) -> None:
        super().__init__(message)
        self.rows = rows or []
        self.problems = problems if problems is not None else [str(p) for p in self.rows]


@dataclass(frozen=True)
class CheckedRows:
    """Rows checked against a version's parameters: ``valid`` holds each good row's number and
    typed inputs, ``invalid`` each other row's number, its cells as sent and its problems."""

    columns: list[str]
    valid: list[tuple[int, dict[str, Any]]]
    invalid: list[tuple[int, dict[str, Any], list[RowProblem]]]


def _check_rows(
    version: WorkflowVersion,
    columns: list[str],
    rows: list[tuple[int, Mapping[str, Any]]],
    *,
    known: dict[int, list[RowProblem]],
    launch_valid_rows: bool,
    where: str,
) -> CheckedRows:
    """Type every row as the launch form would (``known`` holds problems found while reading).
    Every problem is listed, never only the first, so a person fixes the rows once."""
    if not rows:
        raise BatchRefused("There are no rows to launch.")
    if len(rows) > settings.BATCH_MAX_ROWS:
        raise BatchRefused(
            f"There are {len(rows)} rows; one batch takes at most {settings.BATCH_MAX_ROWS}."
        )
    names = {p.name for p in parameters_of(version)}
    valid: list[tuple[int, dict[str, Any]]] = []
    invalid: list[tuple[int, dict[str, Any], list[RowProblem]]] = []
    for number, raw in rows:
        found = known.get(number, [])
        if not found:
            try:
                valid.append((number, coerce_inputs(version, raw)))
            except RunError as exc:
                found = [
                    RowProblem(number, field if field in names else "", message)
                    for field, messages in exc.field_errors.items()
                    for message in messages
                ]
        if found:
            invalid.append((number, dict(raw), found))
    problems = [p for _, _, found in invalid for p in found]
    if problems and not (launch_valid_rows and valid):
        count = "1 problem" if len(problems) == 1 else f"{len(problems)} problems"
        raise BatchRefused(f"{count} in {where}; nothing was launched.", rows=problems)
    return CheckedRows(columns, valid, invalid)


def batch_parse(
    *, version: WorkflowVersion, content: bytes, launch_valid_rows: bool = False
) -> CheckedRows:
    """Check a whole CSV file against the version's parameters: the columns and every row.

    Raises BatchRefused listing every problem; with ``launch_valid_rows`` the problems of single
    rows refuse only those rows (unless no row is valid), never a file whose columns are wrong.
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
    known = {
        line: [RowProblem(line, "", f"has {len(row)} cells, the header has {len(header)}.")]
        for line, row in body
        if len(row) != len(header)
    }
    return _check_rows(
        version,
        header,
        [(line, dict(zip(header, row, strict=False))) for line, row in body],
        known=known,
        launch_valid_rows=launch_valid_rows,
        where="the file",
    )


def batch_check_rows(
    *, version: WorkflowVersion, rows: Sequence[Mapping[str, Any]], launch_valid_rows: bool = False
) -> CheckedRows:
    """``batch_parse`` for rows that come as data (one mapping of parameter to value each,
    numbered from 1) rather than as a file: the same checks of every row."""
    sent = {name for row in rows for name in row}
    columns = [p.name for p in parameters_of(version) if p.name in sent]
    return _check_rows(
        version,
        columns,
        list(enumerate(rows, start=1)),
        known={},
        launch_valid_rows=launch_valid_rows,
        where="the rows",
    )


def _request_digest(
    *, content: bytes | None, rows: Sequence[Mapping[str, Any]] | None, launch_valid_rows: bool
) -> str:
    body = content if content is not None else json.dumps(rows, sort_keys=True).encode()
    kind = b"csv" if content is not None else b"rows"
    flag = b"valid-only" if launch_valid_rows else b"all"
    return hashlib.sha256(b"\0".join([kind, flag, body])).hexdigest()


def _replayed(batch: Batch, workflow_id: int, digest: str, key: str) -> Batch:
    if batch.workflow_id != workflow_id or batch.request_sha256 != digest:
        raise IdempotencyKeyReused(
            f"the idempotency key {key!r} was already used for a different batch (batch {batch.pk})"
        )
    return batch


def _row_error(problems: list[RowProblem]) -> str:
    return "; ".join(f"{p.field}: {p.message}" if p.field else p.message for p in problems)[:500]


def batch_create_once(
    *,
    workflow_id: int,
    user: User,
    filename: str,
    content: bytes | None = None,
    rows: Sequence[Mapping[str, Any]] | None = None,
    launch_valid_rows: bool = False,
    idempotency_key: str = "",
) -> tuple[Batch, bool]:
    """Check every row (of the CSV ``content``, or the ``rows`` given as data), then save the
    batch and launch its rows: the workflow's queue keeps at most its concurrency limit going,
    the others wait in row order. Returns the batch and whether this call made it.

    Any problem refuses everything and saves nothing, unless ``launch_valid_rows``: then the
    valid rows launch and the others are kept as invalid rows with their problems (a batch
    whose columns are wrong, or with no valid row, is still refused whole). Idempotent with an
    ``idempotency_key``, as ``run_launch_once`` is: the same person, key and request answer with
    the batch made first; the key with another request raises ``IdempotencyKeyReused``.
    """
    if (content is None) == (rows is None):
        raise ValueError("give the rows as CSV content or as data, not both")
    key = idempotency_key.strip()
    digest = _request_digest(content=content, rows=rows, launch_valid_rows=launch_valid_rows)
    if key:
        existing = Batch.objects.filter(created_by=user, idempotency_key=key).first()
        if existing is not None:
            return _replayed(existing, workflow_id, digest, key), False
    workflow = Workflow.objects.get(pk=workflow_id)
    # Each row launches through run_launch, which asks again; refusing here saves no batch.
    if not user_can(user, Capability.LAUNCH_RUNS, team_id=workflow.team_id):
        raise BatchRefused(f"You may not launch runs of {workflow.team}'s workflows.")
    if workflow.archived:
        raise BatchRefused("This workflow is archived.")
    version = published_version(workflow)
    if version is None:
        raise BatchRefused("Publish a version of this workflow before launching a batch.")
    if content is not None:
        checked = batch_parse(version=version, content=content, launch_valid_rows=launch_valid_rows)
    else:
        checked = batch_check_rows(
            version=version, rows=rows or [], launch_valid_rows=launch_valid_rows
        )
    try:
        with transaction.atomic():
            batch = Batch.objects.create(
                workflow=workflow,
                version_number=version.number or 0,
                filename=filename[:255],
                columns=checked.columns,
                created_by=user,
                idempotency_key=key,
                request_sha256=digest,
            )
            BatchRow.objects.bulk_create(
                [
                    *(BatchRow(batch=batch, line=n, inputs=inputs) for n, inputs in checked.valid),
                    *(
                        BatchRow(
                            batch=batch,
                            line=n,
                            inputs=cells,
                            status=BatchRow.Status.INVALID,
                            error=_row_error(problems),
                            problems=[{"field": p.field, "message": p.message} for p in problems],
                        )
                        for n, cells, problems in checked.invalid
                    ),
                ]
            )
            facts: dict[str, Any] = {
                "workflow": workflow.slug,
                "version": version.number,
                "filename": batch.filename,
                "rows": len(checked.valid),
            }
            if checked.invalid:
                facts["invalid_rows"] = [n for n, _, _ in checked.invalid]
            audit_record(
                action="batch.created",
                object_type="batch",
                object_id=batch.pk,
                team_id=workflow.team_id,
                actor=user,
                after=facts,
            )
            batch_release(workflow_id=workflow.pk)
    except IntegrityError:
        # Two requests with one key raced; the other one made the batch, which is the answer.
        existing = (
            Batch.objects.filter(created_by=user, idempotency_key=key).first() if key else None
        )
        if existing is None:
            raise
        return _replayed(existing, workflow_id, digest, key), False
    return batch, True


def batch_create(*, workflow_id: int, user: User, filename: str, content: bytes) -> Batch:
    """Launch every row of a CSV file (``batch_create_once`` without a key: each upload is a
    new batch)."""
    batch, _ = batch_create_once(
        workflow_id=workflow_id, user=user, filename=filename, content=content
    )
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
