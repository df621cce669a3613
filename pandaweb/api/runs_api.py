"""Runs and the questions they ask over the API: launch, list, read, cancel, run again or continue,
reconcile, answer, and the run's files and evidence bundle; each calls the service the run page
calls, with the scope its capability needs.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.http import FileResponse, Http404, HttpRequest
from ninja import Query, Router, Status

from approvals import selectors as approval_selectors
from approvals.models import Question
from approvals.questions import QuestionRefused, question_answer
from pandaweb.api import problems
from pandaweb.api.access import token_with_scope
from pandaweb.api.documents import (
    run_out,
    run_question_out,
    run_summary,
    serve_file,
)
from pandaweb.api.idempotency import idempotency_key_header, key_reused
from pandaweb.api.paging import MAX_PAGE, cursor_decode, cursor_encode
from pandaweb.api.problems import Problem
from pandaweb.api.schemas import (
    AnswerIn,
    CallbackOut,
    ReconcileIn,
    RunAgainIn,
    RunLaunchedOut,
    RunLaunchIn,
    RunOut,
    RunPage,
    RunQuestionOut,
    RunSummary,
)
from pandaweb.api.scopes import Scope
from pandaweb.audit.bundles import run_bundle_to_file
from pandaweb.core.permissions import in_teams
from pandaweb.core.roles import Capability
from pandaweb.webhooks.services import (
    CallbackMismatch,
    callback_for_launch,
    callback_url_problem,
)
from sessions import selectors as run_selectors
from sessions.console_services import run_rerun
from sessions.models import Artifact, Run
from sessions.services import (
    IdempotencyKeyReused,
    RunError,
    TransitionRefused,
    parse_priority,
    run_cancel,
    run_launch_once,
    run_reconcile,
)
from workflows.models import Workflow

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")

runs = Router(tags=["runs"])


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
    context = token_with_scope(request, Scope.RUNS_LAUNCH)
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
        **run_out(run).model_dump(),
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
    context = token_with_scope(request, Scope.RUNS_READ)
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
        items=[RunSummary(**run_summary(r)) for r in page],
        next_cursor=cursor_encode(page[-1].pk) if len(found) > limit else None,
    )


@runs.get("/{int:run_id}", response=RunOut, url_name="run_get")
def run_get(request: HttpRequest, run_id: int) -> RunOut:
    """Status, steps, outputs, failure reason, approvals and links to screenshots and files."""
    context = token_with_scope(request, Scope.RUNS_READ)
    return run_out(run_selectors.run_get(run_id, user=context.user))


@runs.post("/{int:run_id}/cancel", response=RunOut, url_name="run_cancel")
def cancel(request: HttpRequest, run_id: int) -> RunOut:
    """Stop the run (idempotent: a finished run is returned as it is)."""
    context = token_with_scope(request, Scope.RUNS_LAUNCH)
    run_selectors.run_get(run_id, user=context.user)
    try:
        run_cancel(run_id=run_id, user=context.user)
    except TransitionRefused as exc:
        raise Problem(409, str(exc)) from None
    return run_out(run_selectors.run_get(run_id, user=context.user))


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
    context = token_with_scope(request, Scope.RUNS_LAUNCH)
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
    return Status(201 if created else 200, run_out(rerun))


@runs.post(
    "/{int:run_id}/reconcile",
    response=RunOut,
    url_name="run_reconcile",
    summary="Say whether an uncertain action happened",
)
def reconcile(request: HttpRequest, run_id: int, payload: ReconcileIn) -> RunOut:
    """Settle a run that needs reconciliation (an approved irreversible action started and its
    end was never recorded): say, after looking at the portal, whether the action happened. The
    run page's rule: someone who may decide approvals in its team, neither its launcher nor one
    of the action's approvers.

    Scope: ``approvals:decide`` (it is a decision like an approval)."""
    context = token_with_scope(request, Scope.APPROVALS_DECIDE)
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
    return run_out(run_selectors.run_get(run_id, user=context.user))


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
    context = token_with_scope(request, Scope.QUESTIONS_ANSWER)
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
    return run_question_out(question)


@runs.get("/{int:run_id}/files/{path:path}", url_name="run_file")
def run_file(request: HttpRequest, run_id: int, path: str) -> FileResponse:
    """A screenshot or other file of the run (links come with the run)."""
    context = token_with_scope(request, Scope.RUNS_READ)
    run = run_selectors.run_get(run_id, user=context.user)
    root = (Path(settings.RUN_FILES_DIR) / str(run.pk)).resolve()
    target = (root / path).resolve()
    if not target.is_relative_to(root) or not target.is_file():
        raise Http404("no such file")
    return serve_file(target, filename=target.name)


@runs.get("/{int:run_id}/artifacts/{int:artifact_id}", url_name="run_artifact")
def run_artifact(request: HttpRequest, run_id: int, artifact_id: int) -> FileResponse:
    """A file the run downloaded from the portal, under its own name."""
    context = token_with_scope(request, Scope.RUNS_READ)
    run_selectors.run_get(run_id, user=context.user)
    artifact = Artifact.objects.filter(run_id=run_id, pk=artifact_id).first()
    if artifact is None:
        raise Http404("no such artifact")
    root = (Path(settings.RUN_FILES_DIR) / str(run_id)).resolve()
    target = (root / artifact.path).resolve()
    if not target.is_relative_to(root) or not target.is_file():
        raise Http404("no such artifact")
    return serve_file(target, filename=artifact.filename)


@runs.get("/{int:run_id}/bundle", url_name="run_bundle")
def run_bundle(request: HttpRequest, run_id: int) -> FileResponse:
    """The run's evidence bundle (zip), the same as the audit page's; each download is audited."""
    context = token_with_scope(request, Scope.AUDIT_READ)
    run_selectors.run_get(run_id, user=context.user)
    path = run_bundle_to_file(run_id=run_id, user=context.user)
    return serve_file(path, filename=f"pandaweb-run-{run_id}-evidence.zip", delete=True)


# Questions ---------------------------------------------------------------------------------------

questions = Router(tags=["questions"])


@questions.get("/", response=list[RunQuestionOut], url_name="question_list")
def question_list(request: HttpRequest) -> list[RunQuestionOut]:
    """The questions waiting for the token's owner (of runs they launched, or asked of a group
    they are in), soonest to expire first.

    Scope: ``questions:answer``."""
    context = token_with_scope(request, Scope.QUESTIONS_ANSWER)
    return [
        run_question_out(q) for q in approval_selectors.questions_for(context.user, limit=MAX_PAGE)
    ]
