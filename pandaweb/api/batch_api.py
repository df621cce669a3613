"""Batches over the API: launch one run per row (a CSV file, or rows as JSON), follow a batch,
download its outputs. The batch page's services do each: every row is checked as the launch form
checks inputs, the runs join the workflow's queue, the batch is audited as ``batch.created``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from ninja import Query, Router, Schema, Status
from pydantic import Field

from pandaweb.api.access import token_with_scope
from pandaweb.api.idempotency import idempotency_key_header, key_reused
from pandaweb.api.problems import Problem
from pandaweb.api.schemas import InputValue
from pandaweb.api.scopes import Scope
from pandaweb.core.permissions import in_teams
from pandaweb.core.roles import Capability
from pandaweb.schedules import selectors, services
from pandaweb.schedules.models import Batch, BatchRow
from pandaweb.schedules.services.versions import published_version
from sessions.services import IdempotencyKeyReused
from workflows.models import Workflow

router = Router(tags=["batches"])

INVALID = "the request is not valid"
ROWS_FILENAME = "rows sent to the API"
LAUNCH_VALID_ROWS = (
    "Launch the valid rows and keep the others back as invalid, each with its problems; "
    "otherwise any invalid row refuses the whole batch and nothing is launched."
)


class RowProblemOut(Schema):
    row: int = Field(
        description="The row as people count it: the file's line (the header is line 1), or "
        "the position in ``rows`` (the first is 1)."
    )
    field: str = Field(description="The parameter (the column); empty for the row as a whole.")
    message: str


class BatchRowOut(Schema):
    row: int
    status: str = Field(
        description="The run's status once launched; waiting (for a free slot), refused (the "
        "launch was refused) or invalid (kept back: see problems) before."
    )
    label: str
    inputs: dict[str, Any]
    run: int | None
    approval: int | None = Field(description="The pending approval its run waits at, if any.")
    error: str
    problems: list[dict[str, str]]
    links: dict[str, str]


class BatchOut(Schema):
    id: int
    workflow: str
    version: int
    filename: str
    created_by: str
    created_at: datetime
    total: int
    settled: int = Field(description="Rows whose run ended, or that were never launched.")
    done: bool
    counts: dict[str, int] = Field(description="Rows by status label.")
    invalid: list[RowProblemOut] = Field(
        description="The problems of the rows kept back (with launch_valid_rows)."
    )
    rows: list[BatchRowOut]
    links: dict[str, str]


class BatchRowsIn(Schema):
    workflow: str = Field(description="The workflow's slug; its latest published version runs.")
    rows: list[dict[str, InputValue]] = Field(
        description="One object of parameter values per run, checked like a launch's inputs."
    )
    launch_valid_rows: bool = Field(False, description=LAUNCH_VALID_ROWS)


def _out(batch: Batch) -> BatchOut:
    progress = selectors.batch_progress(batch)
    invalid = [
        RowProblemOut(row=v.row.line, field=p["field"], message=p["message"])
        for v in progress.rows
        if v.row.status == BatchRow.Status.INVALID
        for p in v.row.problems
    ]
    return BatchOut(
        id=batch.pk,
        workflow=batch.workflow.slug,
        version=batch.version_number,
        filename=batch.filename,
        created_by=batch.created_by.get_username(),
        created_at=batch.created_at,
        total=progress.total,
        settled=progress.settled,
        done=progress.done,
        counts=progress.counts,
        invalid=invalid,
        rows=[
            BatchRowOut(
                row=v.row.line,
                status=v.status,
                label=v.label,
                inputs=v.row.inputs,
                run=v.row.run_id,
                approval=v.approval_id,
                error=v.row.error,
                problems=v.row.problems,
                links={"run": reverse("api:run_get", kwargs={"run_id": v.row.run_id})}
                if v.row.run_id
                else {},
            )
            for v in progress.rows
        ],
        links={
            "self": reverse("api:batch_get", kwargs={"batch_id": batch.pk}),
            "outputs": reverse("api:batch_outputs", kwargs={"batch_id": batch.pk}),
            "page": reverse("schedules:batch", kwargs={"batch_id": batch.pk}),
        },
    )


def _workflow(slug: str, user: User) -> Workflow:
    """The workflow named, or a 422 on ``workflow`` in the batch page's words (no such workflow
    when it is another team's)."""
    workflow = in_teams(Workflow.objects.filter(slug=slug), user, Capability.VIEW_WORKFLOWS).first()
    if workflow is None:
        message = f"no workflow has the slug {slug!r}"
    elif workflow.archived:
        message = "This workflow is archived."
    elif published_version(workflow) is None:
        message = "Publish a version of this workflow before launching a batch."
    else:
        return workflow
    raise Problem(422, INVALID, errors=[{"field": "workflow", "message": message}])


def _launch(
    request: HttpRequest,
    *,
    slug: str,
    whole: str,
    idempotency_key: str,
    launch_valid_rows: bool,
    **source: Any,
) -> Status[BatchOut]:
    """One way in for both bodies: the workflow, the service, its refusals (``whole`` is the
    field a refusal of all the rows names: the file, or the rows)."""
    context = token_with_scope(request, Scope.RUNS_LAUNCH)
    workflow = _workflow(slug, context.user)
    try:
        batch, created = services.batch_create_once(
            workflow_id=workflow.pk,
            user=context.user,
            launch_valid_rows=launch_valid_rows,
            idempotency_key=idempotency_key,
            **source,
        )
    except IdempotencyKeyReused as exc:
        raise key_reused(exc) from None
    except services.BatchRefused as exc:
        if exc.rows:
            # Each row's problems with the row's number: ``row`` beside the usual ``field``.
            errors = [{"row": p.row, "field": p.field, "message": p.message} for p in exc.rows]
            raise Problem(422, str(exc), type="batch-refused", errors=errors) from None
        errors = [{"field": whole, "message": m} for m in exc.problems or [str(exc)]]
        raise Problem(422, str(exc), type="batch-refused", errors=errors) from None
    return Status(201 if created else 200, _out(selectors.batch_get(batch.pk, user=context.user)))


@router.post(
    "/",
    response={200: BatchOut, 201: BatchOut},
    url_name="batch_launch",
    summary="Launch a batch of rows (JSON)",
)
def batch_launch(
    request: HttpRequest,
    payload: BatchRowsIn,
    idempotency_key: str = idempotency_key_header("the same batch"),
) -> Status[BatchOut]:
    """One run per row of ``rows`` of the workflow's latest published version, as the batch
    page launches a file's rows: every row is checked first; the runs join the workflow's queue
    (at most its concurrency limit run at once, the others wait in row order). 201 with the
    batch; 200 with the batch an earlier request with the same Idempotency-Key and body made.

    A row that is not valid refuses the whole batch (422 ``batch-refused``, ``errors`` naming
    each problem's ``row`` and ``field``; nothing is launched), unless ``launch_valid_rows``.
    Scope: ``runs:launch``."""
    return _launch(
        request,
        slug=payload.workflow,
        whole="rows",
        idempotency_key=idempotency_key,
        launch_valid_rows=payload.launch_valid_rows,
        rows=payload.rows,
        filename=ROWS_FILENAME,
    )


@router.post(
    "/csv",
    response={200: BatchOut, 201: BatchOut},
    url_name="batch_launch_csv",
    summary="Launch a batch from a CSV file",
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "The CSV file the batch page takes: a header line naming the "
            "parameters, one run per row, UTF-8; as the body or as the form field ``file``.",
            "content": {
                "text/csv": {"schema": {"type": "string"}},
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "properties": {"file": {"type": "string", "format": "binary"}},
                        "required": ["file"],
                    }
                },
            },
        }
    },
)
def batch_launch_csv(
    request: HttpRequest,
    workflow: str = Query(..., description="The workflow's slug."),
    launch_valid_rows: bool = Query(False, description=LAUNCH_VALID_ROWS),
    idempotency_key: str = idempotency_key_header("the same batch"),
) -> Status[BatchOut]:
    """The batch page's upload: the same checks of the size, the encoding, the columns and
    every row, with the same messages (``row`` is the file's line). Otherwise as
    ``POST /batches/``. Scope: ``runs:launch``."""
    # Before the body is read: a token without the scope learns nothing of its file.
    token_with_scope(request, Scope.RUNS_LAUNCH)
    filename, content = _csv_body(request)
    return _launch(
        request,
        slug=workflow,
        whole="file",
        idempotency_key=idempotency_key,
        launch_valid_rows=launch_valid_rows,
        content=content,
        filename=filename,
    )


def _csv_body(request: HttpRequest) -> tuple[str, bytes]:
    # One byte past the limit is enough for the service to refuse it; never read a huge file
    # whole.
    limit = settings.BATCH_MAX_BYTES + 1
    too_big = f"The file is larger than {settings.BATCH_MAX_BYTES // 1000} kB; split it."
    try:
        if request.content_type == "multipart/form-data":
            upload = request.FILES.get("file")
            if upload is None:
                message = "send the CSV file as the form field 'file'"
                raise Problem(422, INVALID, errors=[{"field": "file", "message": message}])
            return upload.name or "upload.csv", upload.read(limit)
        content = request.body
    except RequestDataTooBig:
        raise Problem(422, INVALID, errors=[{"field": "file", "message": too_big}]) from None
    if not content:
        message = "send the CSV file as the body (Content-Type: text/csv)"
        raise Problem(422, INVALID, errors=[{"field": "file", "message": message}])
    return "batch.csv", content


@router.get("/{int:batch_id}", response=BatchOut, url_name="batch_get", summary="Get a batch")
def batch_get(request: HttpRequest, batch_id: int) -> BatchOut:
    """The batch's progress as its page shows it: each row with its inputs, its run and status,
    the approval its run waits at, and the problems of a row kept back. Scope: ``runs:read``."""
    context = token_with_scope(request, Scope.RUNS_READ)
    return _out(selectors.batch_get(batch_id, user=context.user))


@router.get("/{int:batch_id}/outputs.csv", url_name="batch_outputs", summary="A batch's outputs")
def batch_outputs(request: HttpRequest, batch_id: int) -> HttpResponse:
    """The batch page's outputs file: line, run, status, the inputs, every output and the
    failure reason, one row per line of the batch. Scope: ``runs:read``."""
    context = token_with_scope(request, Scope.RUNS_READ)
    batch = selectors.batch_get(batch_id, user=context.user)
    response = HttpResponse(
        services.batch_outputs_csv(batch), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="batch-{batch.pk}-outputs.csv"'
    return response
