"""Healing a failed step's target, confirmed by a person.

A run failed because a target matched nothing or several elements. The failed step's recorded
observation is what the page showed: its elements are ranked as candidates
(``sessions.engine.healing``), each outlined on the step's screenshot. A person picks one, or
writes a target of their own, and the workflow's draft gets the change, with a publish message
naming the failed run. Nothing changes at run time and nothing runs until the draft is published.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from django.contrib.auth.models import User
from pydantic import ValidationError

from pandaweb.assist.models import ModelCall
from pandaweb.assist.prompts import choosing_prompt, choosing_read, ranking_prompt, ranking_read
from pandaweb.assist.services import model_call_request
from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability
from sessions.engine.healing import Candidate, Place, candidate_at, heal_candidates, place_of
from sessions.engine.pictures import outline_target
from sessions.engine.steps.base import StepBase
from sessions.engine.steps.language import Target
from sessions.models import Run, StepResult
from sessions.services.runstate import run_files_dir
from workflows import services as workflow_services
from workflows.models import WorkflowVersion
from workflows.schema import STEP_ADAPTER

# Earlier passing runs looked at for the place the target's element had.
PLACE_LOOKBACK = 5


class HealingUnavailable(Exception):
    """This step cannot be healed from here, or not this way; the message is for people."""


@dataclass(frozen=True)
class HealProposal:
    run: Run
    result: StepResult
    step: StepBase
    # The step's targets by field (``target``; a login's ``username``, ``password``, ``submit``).
    targets: dict[str, Target]
    field: str
    candidates: list[Candidate]

    @property
    def target(self) -> Target:
        return self.targets[self.field]


def heal_available(*, run: Run, result: StepResult) -> bool:
    """Whether the step's page offers healing: it failed, saw a page, and has a target."""
    try:
        _step_and_targets(run, result)
    except HealingUnavailable:
        return False
    return True


def heal_proposal(*, run: Run, result: StepResult, user: User, field: str = "") -> HealProposal:
    """The candidates for one of a failed step's targets: ``field``, or the one its error names
    (a login step has three), or its first. Only for someone who writes the run's team's
    workflows: the proposal is what the model is asked about and what goes into the draft."""
    _refuse_outside_team(run, user)
    step, targets = _step_and_targets(run, result)
    named = [
        name for name, t in targets.items() if t.readable_name and t.readable_name in result.error
    ]
    chosen = field or (named[0] if named else next(iter(targets)))
    if chosen not in targets:
        raise HealingUnavailable(f"step '{step.id}' has no target '{chosen}'")
    candidates = heal_candidates(
        targets[chosen],
        result.elements,
        was=_last_place(run, result, targets[chosen]),
        interactive_only=step.touches_page,
    )
    return HealProposal(run, result, step, targets, chosen, candidates)


def _refuse_outside_team(run: Run, user: User) -> None:
    if not user_can(user, Capability.AUTHOR_WORKFLOWS, team_id=run.team_id):
        raise HealingUnavailable(f"you do not write {run.team}'s workflows")


def _step_and_targets(run: Run, result: StepResult) -> tuple[StepBase, dict[str, Target]]:
    if result.status != StepResult.Status.FAILED:
        raise HealingUnavailable("only a failed step is healed")
    if not result.elements:
        raise HealingUnavailable("the step recorded no page to look for the element on")
    steps = run.version.steps or []
    if result.index >= len(steps):
        raise HealingUnavailable("the run's version has no such step")
    try:
        step = STEP_ADAPTER.validate_python(steps[result.index])
    except ValidationError:
        raise HealingUnavailable("the run's version of this step no longer reads") from None
    targets = {name: value for name, value in step.__dict__.items() if isinstance(value, Target)}
    if not targets:
        raise HealingUnavailable(f"the {step.label.lower()} step has no target of its own to heal")
    return step, targets


def _last_place(run: Run, result: StepResult, target: Target) -> Place | None:
    """Where the target's element was on the page the step last acted on successfully (the page
    before it: the previous step's observation), in this workflow's recent passing runs."""
    passes = (
        StepResult.objects.filter(
            run__version__workflow_id=run.version.workflow_id,
            step_id=result.step_id,
            status=StepResult.Status.SUCCEEDED,
            index__gt=0,
        )
        .exclude(run_id=run.pk)
        .order_by("-run_id")
        .values_list("run_id", "index")[:PLACE_LOOKBACK]
    )
    for run_id, index in passes:
        before = (
            StepResult.objects.filter(run_id=run_id, index=index - 1).only("observation").first()
        )
        elements = before.elements if before is not None else []
        place = place_of(target, elements, f"when run #{run_id} passed this step")
        if place is not None:
            return place
    return None


def heal_rank_ask(*, proposal: HealProposal, user: User) -> ModelCall:
    """Have the configured model order the candidates: the question is recorded and a worker asks
    it (``heal_answered`` reads the answer). Raises ``ModelUnavailable`` when assistance is
    off."""
    prompt = ranking_prompt(
        step_kind=proposal.step.label.lower(),
        looked_for=proposal.target.describe(),
        candidates=proposal.candidates,
        run_values=_run_values(proposal.run),
    )
    return model_call_request(
        user=user,
        run_id=proposal.run.pk,
        step_index=proposal.result.index,
        target_field=proposal.field,
        purpose=ModelCall.Purpose.RANK,
        prompt=prompt,
        offered=[c.number for c in proposal.candidates],
    )


def heal_describe_ask(*, proposal: HealProposal, user: User, description: str) -> ModelCall:
    """Have the configured model choose the element of the step's page ``description`` means,
    among those the step could use: the question is recorded and a worker asks it
    (``heal_answered`` reads the answer). Raises ``ModelUnavailable`` when assistance is off,
    ``HealingUnavailable`` without a description."""
    description = " ".join(description.split())[:300]
    if not description:
        raise HealingUnavailable("describe the element first")
    interactive_only = proposal.step.touches_page
    menu = [e for e in proposal.result.elements if e.get("interactive") or not interactive_only]
    prompt, offered = choosing_prompt(
        description=description, elements=menu, run_values=_run_values(proposal.run)
    )
    return model_call_request(
        user=user,
        run_id=proposal.run.pk,
        step_index=proposal.result.index,
        target_field=proposal.field,
        purpose=ModelCall.Purpose.CHOOSE,
        description=description,
        prompt=prompt,
        offered=offered,
    )


def heal_answered(*, proposal: HealProposal, call: ModelCall) -> HealProposal:
    """The candidates as ``call`` (about this proposal's step and target, no longer pending)
    proposes: in the model's order (those it left out last), or the element it chose from a
    description first, as a candidate like the others. Changes nothing: the person still picks.
    Raises ``HealingUnavailable`` when the model did not answer, or named no element the step
    could use."""
    if call.status == ModelCall.Status.FAILED:
        raise HealingUnavailable(call.error)
    if call.purpose == ModelCall.Purpose.RANK:
        order = ranking_read(call.answer, call.offered)
        position = {number: place for place, number in enumerate(order)}
        ranked = sorted(proposal.candidates, key=lambda c: position.get(c.number, len(order)))
        return replace(proposal, candidates=ranked)
    number = choosing_read(call.answer, call.offered)
    chosen = (
        candidate_at(
            proposal.target,
            proposal.result.elements,
            number,
            f"the model's choice for '{call.description}'",
            interactive_only=proposal.step.touches_page,
        )
        if number is not None
        else None
    )
    if chosen is None:
        raise HealingUnavailable(f"the model named no element of the page for '{call.description}'")
    others = [c for c in proposal.candidates if c.number != chosen.number]
    return replace(proposal, candidates=[chosen, *others])


def _run_values(run: Run) -> dict[str, str]:
    """What the run was given and read, by the reference that names it: page words that echo
    them are put back as references before a model reads them."""
    values = {f"{{{{ params.{k} }}}}": str(v) for k, v in (run.inputs or {}).items()}
    values |= {f"{{{{ outputs.{k} }}}}": str(v) for k, v in (run.outputs or {}).items()}
    return values


def heal_apply(
    *,
    proposal: HealProposal,
    user: User,
    number: int | None = None,
    written: str = "",
    confirm: str = "",
) -> WorkflowVersion:
    """Put element ``number`` of the step's page (a candidate, or any element the step could
    use: the person confirms it by choosing it) or the ``written`` target (the editor's one-line
    form) into the workflow's draft. Raises ``workflow_services.WorkflowError`` in people's
    words."""
    if number is not None:
        candidate = next((c for c in proposal.candidates if c.number == number), None) or (
            candidate_at(
                proposal.target,
                proposal.result.elements,
                number,
                "chosen",
                interactive_only=proposal.step.touches_page,
            )
        )
        if candidate is None:
            raise workflow_services.WorkflowError(f"element [{number}] cannot be this target")
        chosen = candidate.target
    else:
        try:
            chosen = Target.from_compact(written)
        except ValueError as exc:
            raise workflow_services.WorkflowError("target", {"target": [str(exc)]}) from None
    step = proposal.step
    note = (
        f"Step '{step.id}': {proposal.target.describe()} → {chosen.describe()}, "
        f"after run #{proposal.run.pk} failed"
    )
    return workflow_services.step_target_heal(
        workflow_id=proposal.run.version.workflow_id,
        user=user,
        step_id=step.id,
        field=proposal.field,
        target=chosen.model_dump(exclude_defaults=True),
        expected=proposal.target.model_dump(exclude_defaults=True),
        note=note[:500],
        run_id=proposal.run.pk,
        confirm=confirm,
    )


def element_picture(*, run: Run, result: StepResult, user: User, number: int) -> bytes:
    """The step's screenshot with element ``number`` of its observation outlined (PNG)."""
    _refuse_outside_team(run, user)
    element = next((e for e in result.elements if e.get("number") == number), None)
    box = (element or {}).get("box")
    if not box or not result.screenshot or run.files_pruned_at is not None:
        raise HealingUnavailable("no picture of this element")
    path = run_files_dir(run.pk) / result.screenshot
    if not path.is_file():
        raise HealingUnavailable("the step's screenshot is gone")
    return outline_target(path.read_bytes(), (box["x"], box["y"], box["width"], box["height"]))
