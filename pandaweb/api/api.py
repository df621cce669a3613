"""The HTTP API under /api/v1/: thin adapters over the same services the dashboard uses.

Every endpoint: authenticate the token (``services.token_authenticate``), check the scope it needs
*before* looking anything up (so a refusal says nothing about whether an object exists), call one
selector or service, render. Errors are RFC 9457 problem documents (``problems.py``).
"""

from __future__ import annotations

import logging
import mimetypes
import re
from datetime import date, datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Prefetch
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.urls import reverse
from ninja import NinjaAPI, Query, Router, Status
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.security import HttpBearer

from approvals import selectors as approval_selectors
from approvals.models import ApprovalComment, ApprovalDecision, ApprovalRequest, Question
from approvals.policy import approval_audience, approval_refusal
from approvals.questions import QuestionRefused, question_answer
from approvals.services import (
    ApprovalRefused,
    approval_comment,
    approval_decide,
    approval_reassign,
)
from pandaweb.api import (
    healing_api,
    problems,
    ratelimit,
    system_api,
    teams_api,
    tokens_api,
    webhooks_api,
)
from pandaweb.api.access import token_with_scope
from pandaweb.api.batch_api import router as batches_router
from pandaweb.api.credentials_api import router as credentials_router
from pandaweb.api.idempotency import idempotency_key_header, key_reused
from pandaweb.api.jsonschema import parameters_schema
from pandaweb.api.paging import cursor_decode, cursor_encode
from pandaweb.api.parsing import refuse_nul_characters
from pandaweb.api.problems import Problem
from pandaweb.api.schedules_api import router as schedules_router
from pandaweb.api.schemas import (
    AnswerIn,
    ApprovalCommentOut,
    ApprovalOut,
    ApprovalSummary,
    ArtifactOut,
    CallbackOut,
    CommentIn,
    ContinueOut,
    DecisionIn,
    HandOverIn,
    QuestionOut,
    ReconcileIn,
    RunAgainIn,
    RunLaunchedOut,
    RunLaunchIn,
    RunOut,
    RunPage,
    RunQuestionOut,
    RunSummary,
    StepOut,
    VerifyOut,
    WorkflowOut,
    WorkflowVersionOut,
)
from pandaweb.api.scopes import Scope
from pandaweb.api.services import BEARER_NEEDED, TokenContext, token_authenticate, token_refusal
from pandaweb.api.workflow_api import router as workflow_management
from pandaweb.audit import selectors as audit_selectors
from pandaweb.audit.bundles import run_bundle_to_file
from pandaweb.audit.export import ExportError
from pandaweb.audit.exports import AuditExportError, audit_export_to_file, export_team
from pandaweb.audit.services import audit_verify_database, audit_verify_team
from pandaweb.core.permissions import in_teams
from pandaweb.core.roles import Capability
from pandaweb.core.security import with_docs_policy
from pandaweb.webhooks.services import (
    CallbackMismatch,
    callback_for_launch,
    callback_url_problem,
)
from sessions import selectors as run_selectors
from sessions.console_services import run_continue_checks, run_rerun
from sessions.engine.vocabulary import MASK
from sessions.models import Artifact, Run, StepResult
from sessions.services import (
    IdempotencyKeyReused,
    RunError,
    TransitionRefused,
    parse_priority,
    queue_position,
    run_cancel,
    run_launch_once,
    run_reconcile,
)
from workflows import selectors as workflow_selectors
from workflows.fileformat import dump_document
from workflows.models import Workflow, WorkflowVersion
from workflows.schema import WorkflowDocument

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
MAX_PAGE = 200


class TokenAuth(HttpBearer):
    """``Authorization: Bearer pw_…`` or an OAuth client's ``pwo_…``; then the rate limit of the
    token or the client."""

    openapi_description = (
        "A pandaweb API token (pw_…), made on your profile's token page, or an OAuth client's "
        "access token (pwo_…) from /oauth/token/ (client credentials grant)."
    )

    def authenticate(self, request: HttpRequest, token: str) -> TokenContext | None:
        context = token_authenticate(token)
        if context is None:
            raise _unauthenticated_problem(token_refusal(token))
        verdict = ratelimit.check(
            ratelimit.default_counter(),
            context.principal,
            limit=settings.API_RATE_LIMIT_PER_MINUTE,
        )
        if not verdict.allowed:
            raise Problem(
                429,
                f"this token may make {verdict.limit} requests a minute; "
                f"try again in {verdict.retry_after} s",
                headers={"Retry-After": str(verdict.retry_after)},
            )
        # Audit events written while this request is handled name the token (audit_record).
        request.api_token = context  # type: ignore[attr-defined]
        # Here, before any operation reads its parameters: ninja reports an exception from its
        # body parser as "cannot parse", not as the field at fault.
        refuse_nul_characters(request)
        return context


logger = logging.getLogger(__name__)

api = NinjaAPI(
    title="pandaweb API",
    version="1",
    description=(
        "Launch and follow runs, manage workflows, answer the questions runs ask, decide "
        "approvals and export the "
        "audit trail. Every request carries a token: `Authorization: Bearer pw_…` (an API token) "
        "or `Bearer pwo_…` (an OAuth client's access token from /oauth/token/), with the scope "
        "each operation names. Errors are RFC 9457 problem documents."
    ),
    auth=TokenAuth(),
    urls_namespace="api",
    docs_url="/docs",
    docs_decorator=with_docs_policy,
    openapi_url="/openapi.json",
)


# Problems ----------------------------------------------------------------------------------------


@api.exception_handler(Problem)
def _problem(request: HttpRequest, exc: Problem) -> HttpResponse:
    return problems.render(request, exc)


def _unauthenticated_problem(detail: str) -> Problem:
    return Problem(401, detail, headers={"WWW-Authenticate": 'Bearer realm="pandaweb"'})


@api.exception_handler(AuthenticationError)
def _unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return problems.render(request, _unauthenticated_problem(BEARER_NEEDED))


@api.exception_handler(ValidationError)
def _invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    return problems.render(
        request,
        Problem(422, "the request is not valid", errors=problems.from_validation(exc.errors)),
    )


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return problems.render(request, Problem(404, "no such object, or not yours to see"))


@api.exception_handler(PermissionDenied)
def _forbidden(request: HttpRequest, exc: PermissionDenied) -> HttpResponse:
    return problems.render(request, Problem(403, str(exc) or "not allowed"))


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    return problems.render(request, Problem(exc.status_code, str(exc)))


@api.exception_handler(Exception)
def _unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
    # A client gets a problem document it can act on; what failed goes to the log only (the
    # message of an unexpected error may name internals).
    logger.exception("API request %s %s failed", request.method, request.path)
    return problems.render(
        request,
        Problem(
            500,
            "the server could not handle this request; the error is in its log",
            type="internal-error",
        ),
    )


_auth = token_with_scope


def _url(name: str, **kwargs: Any) -> str:
    return reverse(f"api:{name}", kwargs=kwargs)


def _serve(path: Path, *, filename: str, delete: bool = False) -> FileResponse:
    content_type = mimetypes.guess_type(filename)[0] or "application/octet-stream"
    handle = path.open("rb")
    if delete:
        # The file is ours (a fresh export): gone from disk once opened, read to the end anyway.
        path.unlink(missing_ok=True)
    response = FileResponse(
        handle, content_type=content_type, as_attachment=True, filename=filename
    )
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    return response


# Workflows ---------------------------------------------------------------------------------------

workflows = Router(tags=["workflows"])


def _workflow_out(workflow: Workflow) -> WorkflowOut:
    latest = getattr(workflow, "latest_number", None)
    return WorkflowOut(
        slug=workflow.slug,
        name=workflow.name,
        team=workflow.team.slug,
        description=workflow.description,
        latest_version=latest,
        archived=workflow.archived,
        links={"latest": _url("workflow_version", slug=workflow.slug, number=latest)}
        if latest
        else {},
    )


@workflows.get("/", response=list[WorkflowOut], url_name="workflow_list")
def workflow_list(request: HttpRequest, archived: bool = False) -> list[WorkflowOut]:
    """Workflows of the teams where the token's owner sees workflows, by name."""
    context = _auth(request, Scope.WORKFLOWS_READ)
    listed = workflow_selectors.workflow_list(user=context.user, archived=archived).filter(  # type: ignore[misc]
        published_count__gt=0
    )
    return [_workflow_out(w) for w in listed]


def _published(slug: str, number: int, user: User) -> WorkflowVersion:
    """A published version, 404 also when the workflow is another team's."""
    return workflow_selectors.version_get(workflow_selectors.workflow_get(slug, user=user), number)


@workflows.get(
    "/{slug}/versions/{int:number}", response=WorkflowVersionOut, url_name="workflow_version"
)
def workflow_version(request: HttpRequest, slug: str, number: int) -> WorkflowVersionOut:
    """One published version with its parameters and their JSON Schema (what ``inputs`` takes)."""
    context = _auth(request, Scope.WORKFLOWS_READ)
    version = _published(slug, number, context.user)
    document = version.document or {}
    parameters = list(document.get("parameters", []))
    return WorkflowVersionOut(
        workflow=slug,
        number=number,
        published_at=version.published_at,
        content_hash=version.content_hash,
        message=version.message,
        parameters=parameters,
        inputs_schema=parameters_schema(parameters),
        steps=len(document.get("steps", [])),
        links={"yaml": _url("workflow_version_yaml", slug=slug, number=number)},
    )


@workflows.get("/{slug}/versions/{int:number}/yaml", url_name="workflow_version_yaml")
def workflow_version_yaml(request: HttpRequest, slug: str, number: int) -> HttpResponse:
    """The version as a workflow file, the same as the dashboard's export."""
    context = _auth(request, Scope.WORKFLOWS_READ)
    version = _published(slug, number, context.user)
    text = dump_document(WorkflowDocument.model_validate(version.document), "yaml")
    response = HttpResponse(text, content_type="application/yaml; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{slug}-v{number}.yaml"'
    return response


# Runs --------------------------------------------------------------------------------------------

runs = Router(tags=["runs"])


def _run_links(run: Run) -> dict[str, str]:
    return {
        "self": _url("run_get", run_id=run.pk),
        "bundle": _url("run_bundle", run_id=run.pk),
        "page": reverse("runs:detail", kwargs={"run_id": run.pk}),
    }


def _summary(run: Run) -> dict[str, Any]:
    return {
        "id": run.pk,
        "workflow": run.workflow.slug,
        "version": run.version.number,
        "status": run.status,
        "launched_by": run.launched_by.get_username(),
        "created_at": run.created_at,
        "finished_at": run.finished_at,
        "inputs": run.inputs,
        "outputs": run.outputs,
        "links": _run_links(run),
    }


def _approval_summary(approval: ApprovalRequest) -> ApprovalSummary:
    return ApprovalSummary(
        id=approval.pk,
        status=approval.status,
        step_id=approval.step_id,
        action=approval.action,
        created_at=approval.created_at,
        expires_at=approval.expires_at,
        evidence_sha256=approval.evidence_sha256,
        approvals=approval.approvals_count,
        quorum=approval.quorum,
        links={
            "self": _url("approval_get", approval_id=approval.pk),
            "decide": _url("approval_decide", approval_id=approval.pk),
        },
    )


def _question_fields(question: Question) -> dict[str, Any]:
    answer: str | None = None
    if question.status == Question.Status.ANSWERED or question.answered_at is not None:
        answer = MASK if question.kind == Question.Kind.CODE else question.answer
    return {
        "id": question.pk,
        "status": question.status,
        "step_id": question.step_id,
        "question": question.text,
        "kind": question.kind,
        "options": list(question.options),
        "answered_by": question.answered_by,
        "created_at": question.created_at,
        "expires_at": question.expires_at,
        "answerer": question.answerer.get_username() if question.answerer else None,
        "answered_at": question.answered_at,
        "answer": answer,
        "links": {
            "answer": _url("question_answer", run_id=question.run_id, question_id=question.pk)
        },
    }


def _question_out(question: Question) -> QuestionOut:
    return QuestionOut(**_question_fields(question))


def _run_question_out(question: Question) -> RunQuestionOut:
    """``question`` with its run, workflow and launcher selected."""
    run = question.run
    return RunQuestionOut(
        **_question_fields(question),
        run=run.pk,
        workflow=run.workflow.slug,
        run_status=run.status,
        launched_by=run.launched_by.get_username(),
    )


def _file_url(run_id: int, path: str) -> str | None:
    return _url("run_file", run_id=run_id, path=path) if path else None


def _step_id(run: Run, index: int) -> str:
    steps = (run.version.document or {}).get("steps", [])
    return str(steps[index].get("id", "")) if 0 <= index < len(steps) else ""


def _run_out(run: Run) -> RunOut:
    """The run with its steps, approvals, questions and artifacts: six queries whatever the
    run's size (run, steps, approvals, their decisions, questions with answerers, artifacts),
    three more for a failed run (the steps it may continue from)."""
    steps = (
        StepResult.objects.filter(run=run)
        .only(
            "index",
            "step_id",
            "step_type",
            "sentence",
            "status",
            "started_at",
            "duration_ms",
            "url",
            "error",
            "screenshot",
        )
        .order_by("index")
    )
    approvals = (
        ApprovalRequest.objects.filter(run=run)
        .order_by("created_at", "pk")
        .defer("evidence")
        .prefetch_related(
            Prefetch("decisions", queryset=ApprovalDecision.objects.only("verdict", "request_id"))
        )
    )
    questions = Question.objects.filter(run=run).select_related("answerer").order_by("pk")
    artifacts = Artifact.objects.filter(run=run).order_by("step_index", "pk")
    return RunOut(
        **_summary(run),
        priority=run.get_priority_display().lower(),
        queued_ahead=queue_position(run),
        started_at=run.started_at,
        failure_reason=run.failure_reason,
        failure_step=run.failure_step,
        steps_executed=run.steps_executed,
        idempotency_key=run.idempotency_key,
        rerun_of=run.rerun_of_id,
        start_step=_step_id(run, run.start_index) if run.start_index else None,
        continue_from=[
            ContinueOut(
                step_id=_step_id(run, check.index),
                index=check.index,
                allowed=check.allowed,
                reason=check.reason,
            )
            for check in run_continue_checks(run)
        ],
        steps=[
            StepOut(
                index=s.index,
                step_id=s.step_id,
                type=s.step_type,
                sentence=s.sentence,
                status=s.status,
                started_at=s.started_at,
                duration_ms=s.duration_ms,
                url=s.url,
                error=s.error,
                screenshot=_file_url(run.pk, s.screenshot),
            )
            for s in steps
        ],
        approvals=[_approval_summary(a) for a in approvals],
        questions=[_question_out(q) for q in questions],
        artifacts=[
            ArtifactOut(
                id=a.pk,
                name=a.name,
                filename=a.filename,
                sha256=a.sha256,
                size=a.size,
                step_index=a.step_index,
                download=_url("run_artifact", run_id=run.pk, artifact_id=a.pk),
            )
            for a in artifacts
        ],
    )


@runs.post(
    "/",
    response={200: RunLaunchedOut, 201: RunLaunchedOut},
    url_name="run_launch",
    summary="Launch a run",
)
def launch(
    request: HttpRequest,
    payload: RunLaunchIn,
    idempotency_key: str = idempotency_key_header("the same run"),
) -> Status[RunLaunchedOut]:
    """Queue a run of the workflow's latest published version with typed, validated inputs (the
    same service as the launch form). 201 with the new run; 200 with the earlier run of the same
    Idempotency-Key and body. With a ``callback_url``, the answer carries the secret that signs
    the run's callbacks."""
    context = _auth(request, Scope.RUNS_LAUNCH)
    # Another team's workflow is named as a missing one is: its slug tells the caller nothing.
    visible = in_teams(Workflow.objects.all(), context.user, Capability.VIEW_WORKFLOWS)
    workflow = visible.filter(slug=payload.workflow).only("pk").first()
    if workflow is None:
        raise Problem(
            422,
            "the request is not valid",
            errors=[
                {"field": "workflow", "message": f"no workflow has the slug {payload.workflow!r}"}
            ],
        )
    callback_url = payload.callback_url.strip()
    if callback_url and (problem := callback_url_problem(callback_url)):
        raise Problem(
            422, "the request is not valid", errors=[{"field": "callback_url", "message": problem}]
        )
    try:
        priority = parse_priority(payload.priority)
        # One transaction: the run is handed to a worker on commit, so no event of it can
        # come before its callback exists.
        with transaction.atomic():
            run, created = run_launch_once(
                workflow_id=workflow.pk,
                user=context.user,
                raw_inputs=payload.inputs,
                idempotency_key=idempotency_key,
                priority=priority,
            )
            callback = callback_for_launch(
                run=run, created=created, url=callback_url, user=context.user
            )
    except (IdempotencyKeyReused, CallbackMismatch) as exc:
        raise key_reused(exc) from None
    except RunError as exc:
        raise _launch_refusal(exc) from None
    launched = RunLaunchedOut(
        **_run_out(run).model_dump(),
        callback=CallbackOut(url=callback[0], secret=callback[1]) if callback else None,
    )
    return Status(201 if created else 200, launched)


def _launch_refusal(exc: RunError) -> Problem:
    """A refused launch or re-run: 422 naming the field (an input under ``inputs``), 409 when
    the workflow's or run's state refused it."""
    if "priority" in exc.field_errors or "idempotency_key" in exc.field_errors:
        return Problem(
            422, "the request is not valid", errors=problems.field_errors(exc.field_errors)
        )
    if exc.field_errors:
        return Problem(
            422,
            "the inputs are not valid",
            errors=problems.field_errors(exc.field_errors, under="inputs"),
        )
    return Problem(409, str(exc))


def _pairs(values: list[str], field: str) -> tuple[tuple[str, Any], ...]:
    pairs = []
    for text in values:
        name, sep, value = text.partition("=")
        if not sep or not _NAME.match(name):
            raise Problem(
                422,
                "the request is not valid",
                errors=[{"field": field, "message": f"{text!r} is not name=value"}],
            )
        pairs.append((name, {"true": True, "false": False}.get(value, value)))
    return tuple(pairs)


@runs.get("/", response=RunPage, url_name="run_list")
def run_list(
    request: HttpRequest,
    workflow: str = "",
    status: list[Run.Status] = Query([]),  # noqa: B008 (ninja's way of declaring a list param)
    launched_by: str = "",
    created_from: datetime | None = None,
    created_to: datetime | None = None,
    input: list[str] = Query([], description="name=value, exact; repeatable"),  # noqa: B008
    output: list[str] = Query([], description="name=value, exact; repeatable"),  # noqa: B008
    limit: int = Query(50, ge=1, le=MAX_PAGE),
    cursor: str = "",
) -> RunPage:
    """Runs, newest first, one page at a time: follow ``next_cursor`` (keyset pagination, stable
    while runs are being launched)."""
    context = _auth(request, Scope.RUNS_READ)
    filters = run_selectors.RunFilters(
        workflow=workflow,
        statuses=tuple(str(s) for s in status),
        launched_by=launched_by,
        created_from=created_from,
        created_to=created_to,
        inputs=_pairs(input, "input"),
        outputs=_pairs(output, "output"),
    )
    found = run_selectors.run_keyset(
        filters,
        user=context.user,
        before_id=cursor_decode(cursor) if cursor else None,
        limit=limit + 1,
    )
    page = found[:limit]
    return RunPage(
        items=[RunSummary(**_summary(r)) for r in page],
        next_cursor=cursor_encode(page[-1].pk) if len(found) > limit else None,
    )


@runs.get("/{int:run_id}", response=RunOut, url_name="run_get")
def run_get(request: HttpRequest, run_id: int) -> RunOut:
    """Status, steps, outputs, failure reason, approvals and links to screenshots and files."""
    context = _auth(request, Scope.RUNS_READ)
    return _run_out(run_selectors.run_get(run_id, user=context.user))


@runs.post("/{int:run_id}/cancel", response=RunOut, url_name="run_cancel")
def cancel(request: HttpRequest, run_id: int) -> RunOut:
    """Stop the run (idempotent: a finished run is returned as it is)."""
    context = _auth(request, Scope.RUNS_LAUNCH)
    run_selectors.run_get(run_id, user=context.user)
    try:
        run_cancel(run_id=run_id, user=context.user)
    except TransitionRefused as exc:
        raise Problem(409, str(exc)) from None
    return _run_out(run_selectors.run_get(run_id, user=context.user))


@runs.post(
    "/{int:run_id}/again",
    response={200: RunOut, 201: RunOut},
    url_name="run_again",
    summary="Run again, or continue from a step",
)
def again(
    request: HttpRequest,
    run_id: int,
    payload: RunAgainIn,
    idempotency_key: str = idempotency_key_header("the same new run"),
) -> Status[RunOut]:
    """A new run linked to this one (the run page's "Run again"): its inputs unless others are
    given, its version or the latest published one. With ``start_step``, a failed run continues
    from that step with the outputs it had read; refused, in words, past an irreversible step that
    was approved and not reconciled (the run's ``continue_from`` says which steps may start)."""
    context = _auth(request, Scope.RUNS_LAUNCH)
    original = run_selectors.run_get(run_id, user=context.user)
    start_index = 0
    if payload.start_step:
        ids = [str(s.get("id", "")) for s in (original.version.document or {}).get("steps", [])]
        if payload.start_step not in ids:
            raise Problem(
                422,
                "the request is not valid",
                errors=[
                    {
                        "field": "start_step",
                        "message": f"run {run_id}'s version has no step {payload.start_step!r}",
                    }
                ],
            )
        start_index = ids.index(payload.start_step)
    try:
        priority = parse_priority(payload.priority) if payload.priority else None
        rerun, created = run_rerun(
            run_id=original.pk,
            user=context.user,
            raw_inputs=original.inputs if payload.inputs is None else payload.inputs,
            version=payload.version,
            start_index=start_index,
            idempotency_key=idempotency_key,
            priority=priority,
        )
    except IdempotencyKeyReused as exc:
        raise key_reused(exc) from None
    except RunError as exc:
        raise _launch_refusal(exc) from None
    return Status(201 if created else 200, _run_out(rerun))


@runs.post("/{int:run_id}/reconcile", response=RunOut, url_name="run_reconcile")
def reconcile(request: HttpRequest, run_id: int, payload: ReconcileIn) -> RunOut:
    """Settle a run that needs reconciliation (an approved irreversible action started and its
    end was never recorded): say, after looking at the portal, whether the action happened. The
    run page's rule: someone who may decide approvals in its team, neither its launcher nor one
    of the action's approvers.

    Scope: ``approvals:decide`` (it is a decision like an approval)."""
    context = _auth(request, Scope.APPROVALS_DECIDE)
    run_selectors.run_get(run_id, user=context.user)
    try:
        run_reconcile(
            run_id=run_id, user=context.user, happened=payload.happened, note=payload.note
        )
    except TransitionRefused as exc:
        raise Problem(409, str(exc), type="reconcile-refused") from None
    except RunError as exc:
        if exc.field_errors:
            raise Problem(
                422, "the request is not valid", errors=problems.field_errors(exc.field_errors)
            ) from None
        raise Problem(403, str(exc), type="reconcile-refused") from None
    return _run_out(run_selectors.run_get(run_id, user=context.user))


@runs.post(
    "/{int:run_id}/questions/{int:question_id}/answer",
    response=RunQuestionOut,
    url_name="question_answer",
)
def answer(
    request: HttpRequest, run_id: int, question_id: int, payload: AnswerIn
) -> RunQuestionOut:
    """Answer the run's question (an ``ask`` step): the run goes on. Only the person the step
    names (the launcher, or a member of its group) may answer, once, before it expires. The
    answered question comes back with its run's status (the run itself needs ``runs:read``).

    Scope: ``questions:answer`` (``runs:launch`` does not answer)."""
    context = _auth(request, Scope.QUESTIONS_ANSWER)
    run = run_selectors.run_get(run_id, user=context.user)
    if not Question.objects.filter(pk=question_id, run=run).exists():
        raise Http404("no such question")
    try:
        question_answer(question_id=question_id, user=context.user, answer=payload.answer)
    except QuestionRefused as exc:
        if exc.field_errors:
            raise Problem(422, str(exc), errors=problems.field_errors(exc.field_errors)) from None
        raise Problem(409, str(exc), type="answer-refused") from None
    question = Question.objects.select_related("run__workflow", "run__launched_by", "answerer").get(
        pk=question_id
    )
    return _run_question_out(question)


@runs.get("/{int:run_id}/files/{path:path}", url_name="run_file")
def run_file(request: HttpRequest, run_id: int, path: str) -> FileResponse:
    """A screenshot or other file of the run (links come with the run)."""
    context = _auth(request, Scope.RUNS_READ)
    run = run_selectors.run_get(run_id, user=context.user)
    root = (Path(settings.RUN_FILES_DIR) / str(run.pk)).resolve()
    target = (root / path).resolve()
    if not target.is_relative_to(root) or not target.is_file():
        raise Http404("no such file")
    return _serve(target, filename=target.name)


@runs.get("/{int:run_id}/artifacts/{int:artifact_id}", url_name="run_artifact")
def run_artifact(request: HttpRequest, run_id: int, artifact_id: int) -> FileResponse:
    """A file the run downloaded from the portal, under its own name."""
    context = _auth(request, Scope.RUNS_READ)
    run_selectors.run_get(run_id, user=context.user)
    artifact = Artifact.objects.filter(run_id=run_id, pk=artifact_id).first()
    if artifact is None:
        raise Http404("no such artifact")
    root = (Path(settings.RUN_FILES_DIR) / str(run_id)).resolve()
    target = (root / artifact.path).resolve()
    if not target.is_relative_to(root) or not target.is_file():
        raise Http404("no such artifact")
    return _serve(target, filename=artifact.filename)


@runs.get("/{int:run_id}/bundle", url_name="run_bundle")
def run_bundle(request: HttpRequest, run_id: int) -> FileResponse:
    """The run's evidence bundle (zip), the same as the audit page's; each download is audited."""
    context = _auth(request, Scope.AUDIT_READ)
    run_selectors.run_get(run_id, user=context.user)
    path = run_bundle_to_file(run_id=run_id, user=context.user)
    return _serve(path, filename=f"pandaweb-run-{run_id}-evidence.zip", delete=True)


# Questions ---------------------------------------------------------------------------------------

questions = Router(tags=["questions"])


@questions.get("/", response=list[RunQuestionOut], url_name="question_list")
def question_list(request: HttpRequest) -> list[RunQuestionOut]:
    """The questions waiting for the token's owner (of runs they launched, or asked of a group
    they are in), soonest to expire first.

    Scope: ``questions:answer``."""
    context = _auth(request, Scope.QUESTIONS_ANSWER)
    return [
        _run_question_out(q) for q in approval_selectors.questions_for(context.user, limit=MAX_PAGE)
    ]


# Approvals ---------------------------------------------------------------------------------------

approvals = Router(tags=["approvals"])


def _approval_out(approval: ApprovalRequest) -> ApprovalOut:
    """The request as ``approval_get`` reads it (its assignee joined): three queries whatever the
    number of its decisions and comments (the approvals counted, the decisions and the comments,
    each with their people)."""
    decisions = list(approval_selectors.approval_decisions(approval))
    return ApprovalOut(
        **_approval_summary(approval).model_dump(),
        run=approval.run_id,
        workflow=approval.run.workflow.slug,
        launched_by=approval.run.launched_by.get_username(),
        reason=approval.reason,
        decided_at=approval.decided_at,
        evidence=approval.evidence,
        decisions=[
            {
                "reviewer": d.reviewer.get_username(),
                "verdict": d.verdict,
                "reason": d.reason,
                "evidence_sha256": d.evidence_sha256,
                "at": d.created_at.isoformat(),
            }
            for d in decisions
        ],
        screenshot=_file_url(approval.run_id, approval.outlined or approval.screenshot),
        reviewer_group=approval.reviewer_group,
        escalated_to=approval.escalation_group
        if approval.escalated_at and approval.escalation_group
        else None,
        assignee=approval.assignee.get_username() if approval.assignee else None,
        comments=[_comment_out(c) for c in approval_selectors.approval_comments(approval)],
    )


def _comment_out(comment: ApprovalComment) -> ApprovalCommentOut:
    return ApprovalCommentOut(
        id=comment.pk,
        author=comment.author.get_username(),
        body=comment.body,
        created_at=comment.created_at,
    )


def _refused(exc: ApprovalRefused, *, status: int, type: str) -> Problem:
    """A refusal of an approval service in its words: 422 on the fields it names, else
    ``status``."""
    if exc.field_errors:
        return Problem(422, str(exc), errors=problems.field_errors(exc.field_errors))
    return Problem(status, str(exc), type=type)


@approvals.get("/", response=list[ApprovalSummary], url_name="approval_list")
def approval_list(request: HttpRequest) -> list[ApprovalSummary]:
    """Pending requests the token's owner may decide (not their own runs; their reviewer group),
    oldest first."""
    context = _auth(request, Scope.APPROVALS_READ)
    pending = approval_selectors.approval_decidable_by(context.user).prefetch_related("decisions")
    return [_approval_summary(a) for a in pending[:MAX_PAGE]]


@approvals.get("/{int:approval_id}", response=ApprovalOut, url_name="approval_get")
def approval_get(request: HttpRequest, approval_id: int) -> ApprovalOut:
    """The request with its frozen evidence and ``evidence_sha256``: quote that hash to decide."""
    context = _auth(request, Scope.APPROVALS_READ)
    approval = approval_selectors.approval_get(approval_id, user=context.user)
    # One of the owner's teams' requests, which the page too opens only for who sees that
    # team's queue or launched the run.
    if not approval_selectors.approval_visible_to(context.user, approval):
        raise Problem(403, "you may not see this request", type="approval-hidden")
    return _approval_out(approval)


@approvals.post("/{int:approval_id}/decision", response=ApprovalOut, url_name="approval_decide")
def decide(request: HttpRequest, approval_id: int, payload: DecisionIn) -> ApprovalOut:
    """Approve or reject, quoting the evidence hash you saw. The page's policy applies:
    separation of duties, reviewer group, quorum, expiry."""
    context = _auth(request, Scope.APPROVALS_DECIDE)
    user: User = context.user
    approval = approval_selectors.approval_get(approval_id, user=user)
    refusal = approval_refusal(user, approval)
    if refusal:
        raise Problem(403, refusal, type="decision-refused")
    if approval.status == ApprovalRequest.Status.PENDING and (
        payload.evidence_sha256 != approval.evidence_sha256
    ):
        raise Problem(
            409,
            "the evidence changed since you read it: get the request again and look",
            type="evidence-mismatch",
            evidence_sha256=approval.evidence_sha256,
        )
    try:
        approval_decide(
            approval_id=approval_id,
            user=user,
            approve=payload.verdict == "approve",
            reason=payload.reason,
            evidence_sha256=payload.evidence_sha256,
        )
    except ApprovalRefused as exc:
        raise _refused(exc, status=409, type="decision-refused") from None
    return _approval_out(approval_selectors.approval_get(approval_id, user=user))


@approvals.post(
    "/{int:approval_id}/comments",
    response={201: ApprovalCommentOut},
    url_name="approval_comment",
    summary="Comment on a request",
)
def comment(
    request: HttpRequest, approval_id: int, payload: CommentIn
) -> Status[ApprovalCommentOut]:
    """A remark for everyone who reviews the request, shown in its history (the page's comment
    form): never a verdict, it changes nothing about the request, whatever its status. Whoever
    may open the request comments: the queue of its run's team, and the run's launcher. Not
    idempotent: each call adds a comment. An empty one is a 422 on ``body``.

    Scope: ``approvals:comment``."""
    context = _auth(request, Scope.APPROVALS_COMMENT)
    user: User = context.user
    approval = approval_selectors.approval_get(approval_id, user=user)
    try:
        made = approval_comment(approval_id=approval.pk, user=user, body=payload.body)
    except ApprovalRefused as exc:
        # Not a matter of the request's state: the person may not open it.
        raise _refused(exc, status=403, type="comment-refused") from None
    return Status(201, _comment_out(made))


@approvals.post(
    "/{int:approval_id}/assignee",
    response=ApprovalOut,
    url_name="approval_hand_over",
    summary="Hand a request over",
)
def hand_over(request: HttpRequest, approval_id: int, payload: HandOverIn) -> ApprovalOut:
    """Hand a pending request to one person (``username``: someone of the run's team the policy
    lets decide it) or to one group (``group``: one whose members decide approvals), as the
    page's hand-over: they are told, with ``note``. Only someone who may decide the request hands
    it over (403 otherwise); a decided request, or someone who may not decide it, is a 409 in
    words. Not idempotent: each hand-over is audited.

    Scope: ``approvals:decide``."""
    context = _auth(request, Scope.APPROVALS_DECIDE)
    user: User = context.user
    approval = approval_selectors.approval_get(approval_id, user=user)
    refusal = approval_refusal(user, approval)
    if refusal:
        raise Problem(403, refusal, type="handover-refused")
    username, group = payload.username.strip(), payload.group.strip()
    if bool(username) == bool(group):
        raise Problem(
            422,
            "the request is not valid",
            errors=[{"field": "", "message": "name one person (username) or one group (group)"}],
        )
    assignee = _team_person(approval, username) if username else None
    if group and not Group.objects.filter(name=group).exists():
        raise Problem(
            422,
            "the request is not valid",
            errors=[{"field": "group", "message": f"there is no group named {group!r}"}],
        )
    try:
        approval_reassign(
            approval_id=approval.pk, user=user, assignee=assignee, group=group, note=payload.note
        )
    except ApprovalRefused as exc:
        raise _refused(exc, status=409, type="handover-refused") from None
    return _approval_out(approval_selectors.approval_get(approval_id, user=user))


def _team_person(approval: ApprovalRequest, username: str) -> User:
    """The person named ``username`` among the active people of the run's team (who may decide
    its approvals or watch its runs), or a 422 on ``username``. Someone of another team is
    answered as nobody is: the refusal names no other team's people."""
    named = User.objects.filter(username=username).values_list("pk", flat=True).first()
    person = approval_audience(approval, groups=[], people=[named]).first() if named else None
    if person is None:
        raise Problem(
            422,
            "the request is not valid",
            errors=[
                {"field": "username", "message": f"nobody named {username!r} is in this run's team"}
            ],
        )
    return person


# Audit -------------------------------------------------------------------------------------------

audit = Router(tags=["audit"])


@audit.get("/export", url_name="audit_export")
def audit_export(
    request: HttpRequest,
    date_from: date | None = None,
    date_to: date | None = None,
    actor: str = "",
    action: str = "",
    workflow: str = "",
    run_id: int | None = None,
    team: str = "",
) -> FileResponse:
    """A signed export (zip) of the events the filters select; dates are whole days. With
    ``team`` (a slug), that team's trail, verifiable on its own; a token whose owner has
    Compliance in some teams only exports one of those (their only one by default)."""
    context = _auth(request, Scope.AUDIT_READ)
    filters = audit_selectors.EventFilters(
        date_from=date_from,
        date_to=date_to,
        actor=actor,
        action=action,
        workflow=workflow,
        run_id=run_id,
        team=team,
    )
    try:
        path = audit_export_to_file(user=context.user, filters=filters)
    except AuditExportError as exc:
        raise Problem(422, str(exc), errors=[{"field": exc.field, "message": str(exc)}]) from None
    except ExportError as exc:
        raise Problem(409, f"the trail does not verify: {exc}", type="chain-broken") from None
    return _serve(path, filename="pandaweb-audit-export.zip", delete=True)


@audit.get("/verify", response=VerifyOut, url_name="audit_verify")
def audit_verify(request: HttpRequest, team: str = "") -> VerifyOut:
    """Verify the whole hash chain in the database, or with ``team`` (a slug) that team's chain
    alone; a token whose owner has Compliance in some teams only verifies one of those."""
    context = _auth(request, Scope.AUDIT_READ)
    try:
        chosen = export_team(context.user, audit_selectors.EventFilters(team=team))
    except AuditExportError as exc:
        raise Problem(422, str(exc), errors=[{"field": exc.field, "message": str(exc)}]) from None
    result = audit_verify_database() if chosen is None else audit_verify_team(team_id=chosen.pk)
    return VerifyOut(
        ok=result.ok,
        count=result.count,
        last_sequence=result.last_sequence,
        last_hash=result.last_hash,
        problem=result.reason or None,
        team=chosen.slug if chosen is not None else None,
    )


api.add_router("/workflows", workflows)
api.add_router("/runs", runs)
api.add_router("/runs", healing_api.router)
api.add_router("/questions", questions)
api.add_router("/approvals", approvals)
api.add_router("/audit", audit)
api.add_router("/workflows", workflow_management)
api.add_router("/webhooks", webhooks_api.router)
api.add_router("/tokens", tokens_api.tokens)
api.add_router("/service-accounts", tokens_api.service_accounts)
api.add_router("/system", system_api.router)
api.add_router("/credentials", credentials_router)
api.add_router("/schedules", schedules_router)
api.add_router("/batches", batches_router)
api.add_router("/teams", teams_api.router)


def run_document(run_id: int) -> dict[str, Any]:
    """The run as ``GET /api/v1/runs/{id}`` answers it, for other adapters (the CLI: whoever
    runs manage.py on the server sees every team's runs, as the database does)."""
    run = Run.objects.select_related("workflow", "version", "launched_by").filter(pk=run_id).first()
    if run is None:
        raise Http404("no such run")
    return _run_out(run).model_dump(mode="json")
