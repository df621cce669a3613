"""Healing a failed step over the API: the step page's proposals, their pictures, the model's
ranking or choice, and the person's pick into the workflow's draft (``healing_services``, as the
healing page calls them).

Nothing here changes a run or a published version: a pick goes into the draft, which someone
publishes. A token needs ``runs:read`` (the candidates are what the run's page showed) and
``workflows:write`` (the pick edits the workflow), and its owner authoring rights in the run's
team, as on the page.
"""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse
from ninja import Router, Schema, Status
from pydantic import Field

from pandaweb.api.access import token_with_scope
from pandaweb.api.problems import Problem
from pandaweb.api.schemas import DraftOut
from pandaweb.api.scopes import Scope
from pandaweb.api.services import TokenContext
from pandaweb.api.workflow_api import draft_out, workflow_refusal
from pandaweb.assist import selectors as assist_selectors
from pandaweb.assist.errors import ModelUnavailable
from pandaweb.assist.models import ModelCall
from sessions import healing_services
from sessions import selectors as run_selectors
from sessions.engine.healing import Candidate
from sessions.healing_services import HealingUnavailable, HealProposal
from sessions.models import StepResult
from workflows.services import WorkflowError

router = Router(tags=["healing"])


class CandidateOut(Schema):
    number: int = Field(description="The element's number on the step's page: pick it by this.")
    role: str
    name: str
    target: str = Field(description="The target the step would get, in the editor's one-line form.")
    score: float
    reasons: list[str] = Field(description="Why it may be the element the step meant, in words.")
    matches: int = Field(
        description="How many elements of the step's page this target finds: 1, or it would "
        "fail there too."
    )
    picture: str | None = Field(description="The step's screenshot with this element outlined.")


class ModelCallOut(Schema):
    id: int
    purpose: str = Field(description="rank (order the candidates) or choose (from a description).")
    status: str = Field(description="pending until a worker has the model's answer.")
    description: str
    error: str = Field(description="Why the model proposed nothing ('' otherwise).")


class HealingOut(Schema):
    run: int
    step_index: int
    step_id: str
    error: str = Field(description="Why the step failed.")
    field: str = Field(description="The target being healed (a login step has three).")
    fields: list[str]
    looked_for: str = Field(description="What the step's target asked for, in words.")
    current_target: str
    confirm: str | None = Field(
        description="An irreversible step changes only when its id is sent back as ``confirm``."
    )
    candidates: list[CandidateOut] = Field(
        description="The page's elements most like the target, best first (in the model's "
        "order once it answered)."
    )
    model_call: ModelCallOut | None
    links: dict[str, str]


class ModelAskIn(Schema):
    field: str = ""
    description: str = Field(
        "",
        description="Empty: the model orders the candidates. Words: it chooses the element of "
        "the page they describe.",
        max_length=300,
    )


class HealIn(Schema):
    field: str = ""
    number: int | None = Field(None, description="A candidate's (or any element's) number.")
    target: str = Field(
        "", description="Or a target written in the editor's one-line form.", max_length=500
    )
    confirm: str = Field("", description="The step's id, when the step is irreversible.")


def _authored(request: HttpRequest) -> TokenContext:
    token_with_scope(request, Scope.RUNS_READ)
    return token_with_scope(request, Scope.WORKFLOWS_WRITE)


def _result(run_id: int, index: int, context: TokenContext) -> tuple[Any, StepResult]:
    run = run_selectors.run_get(run_id, user=context.user)
    result = run.step_results.filter(index=index).first()
    if result is None:
        raise Http404("no such step")
    return run, result


def _proposal(run: Any, result: StepResult, context: TokenContext, field: str) -> HealProposal:
    try:
        return healing_services.heal_proposal(
            run=run, result=result, user=context.user, field=field
        )
    except HealingUnavailable as exc:
        raise Problem(
            409, f"this step cannot be healed: {exc}", type="healing-unavailable"
        ) from None


def _candidate_out(run_id: int, index: int, candidate: Candidate, pictures: bool) -> CandidateOut:
    return CandidateOut(
        number=candidate.number,
        role=candidate.role,
        name=candidate.name,
        target=candidate.target.to_compact(),
        score=round(candidate.score, 3),
        reasons=list(candidate.reasons),
        matches=candidate.matches,
        picture=reverse(
            "api:heal_picture",
            kwargs={"run_id": run_id, "index": index, "number": candidate.number},
        )
        if pictures and candidate.box
        else None,
    )


def _healing_out(proposal: HealProposal, call: ModelCall | None, unanswered: str) -> HealingOut:
    run, result = proposal.run, proposal.result
    pictures = bool(result.screenshot) and run.files_pruned_at is None
    here = {"run_id": run.pk, "index": result.index}
    return HealingOut(
        run=run.pk,
        step_index=result.index,
        step_id=proposal.step.id,
        error=result.error,
        field=proposal.field,
        fields=list(proposal.targets),
        looked_for=proposal.target.describe(),
        current_target=proposal.target.to_compact(),
        confirm=proposal.step.id if proposal.step.irreversible else None,
        candidates=[_candidate_out(run.pk, result.index, c, pictures) for c in proposal.candidates],
        model_call=ModelCallOut(
            id=call.pk,
            purpose=call.purpose,
            status=call.status,
            description=call.description,
            error=unanswered,
        )
        if call is not None
        else None,
        links={
            "self": reverse("api:heal_get", kwargs=here),
            "model": reverse("api:heal_model", kwargs=here),
            "page": reverse("runs:heal", kwargs={"run_id": run.pk, "index": result.index}),
        },
    )


@router.get(
    "/{int:run_id}/steps/{int:index}/healing",
    response=HealingOut,
    url_name="heal_get",
    summary="A failed step's healing proposal",
)
def heal_get(
    request: HttpRequest, run_id: int, index: int, field: str = "", call: int | None = None
) -> HealingOut:
    """The elements of the page the failed step saw that may be what its target meant. With
    ``call`` (a model question you asked about this step), the candidates in the model's order,
    or its choice first; poll while its ``status`` is pending."""
    context = _authored(request)
    run, result = _result(run_id, index, context)
    asked = (
        assist_selectors.model_call_get(call, user=context.user, run_id=run.pk, step_index=index)
        if call is not None
        else None
    )
    proposal = _proposal(run, result, context, asked.target_field if asked else field)
    unanswered = ""
    if asked is not None and asked.status != ModelCall.Status.PENDING:
        try:
            proposal = healing_services.heal_answered(proposal=proposal, call=asked)
        except HealingUnavailable as exc:
            unanswered = str(exc)
    return _healing_out(proposal, asked, unanswered)


@router.get(
    "/{int:run_id}/steps/{int:index}/healing/elements/{int:number}.png",
    url_name="heal_picture",
    summary="An element outlined on the failed step's screenshot",
)
def heal_picture(request: HttpRequest, run_id: int, index: int, number: int) -> HttpResponse:
    context = _authored(request)
    run, result = _result(run_id, index, context)
    try:
        picture = healing_services.element_picture(
            run=run, result=result, user=context.user, number=number
        )
    except HealingUnavailable as exc:
        raise Http404(str(exc)) from None
    response = HttpResponse(picture, content_type="image/png")
    response["X-Content-Type-Options"] = "nosniff"
    return response


@router.post(
    "/{int:run_id}/steps/{int:index}/healing/model",
    response={202: HealingOut},
    url_name="heal_model",
    summary="Ask the model about a failed step's page",
)
def heal_model(
    request: HttpRequest, run_id: int, index: int, payload: ModelAskIn
) -> Status[HealingOut]:
    """Have the configured model order the candidates, or choose the element a description
    means. A worker asks it: follow the answer's ``model_call`` with ``GET …/healing?call=``. The
    model sees the page's words with the run's own values put back as references, never a
    credential. 409 when no model is configured."""
    context = _authored(request)
    run, result = _result(run_id, index, context)
    proposal = _proposal(run, result, context, payload.field)
    try:
        call = (
            healing_services.heal_describe_ask(
                proposal=proposal, user=context.user, description=payload.description
            )
            if payload.description.strip()
            else healing_services.heal_rank_ask(proposal=proposal, user=context.user)
        )
    except (ModelUnavailable, HealingUnavailable) as exc:
        raise Problem(409, f"nothing was asked: {exc}", type="model-unavailable") from None
    return Status(202, _healing_out(proposal, call, ""))


@router.post(
    "/{int:run_id}/steps/{int:index}/healing",
    response=DraftOut,
    url_name="heal_apply",
    summary="Put the picked element into the workflow's draft",
)
def heal_apply(request: HttpRequest, run_id: int, index: int, payload: HealIn) -> DraftOut:
    """Point the step's target at element ``number`` of its page, or at a ``target`` you write,
    in the workflow's draft (made if there is none), with a publish message naming the run.
    Runs use it once the draft is published; an irreversible step needs ``confirm``."""
    context = _authored(request)
    run, result = _result(run_id, index, context)
    if (payload.number is None) == (not payload.target.strip()):
        raise Problem(
            422,
            "the request is not valid",
            errors=[
                {"field": "number", "message": "Pick one element by number, or write a target."}
            ],
        )
    proposal = _proposal(run, result, context, payload.field)
    try:
        draft = healing_services.heal_apply(
            proposal=proposal,
            user=context.user,
            number=payload.number,
            written=payload.target,
            confirm=payload.confirm,
        )
    except WorkflowError as exc:
        raise workflow_refusal(exc) from None
    return draft_out(draft.workflow, draft)
