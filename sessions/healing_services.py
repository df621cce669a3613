"""Healing a failed step's target, confirmed by a person.

A run failed because a target matched nothing or several elements. The failed step's recorded
observation is what the page showed: its elements are ranked as candidates
(``sessions.engine.healing``), each outlined on the step's screenshot. A person picks one, or
writes a target of their own, and the workflow's draft gets the change, with a publish message
naming the failed run. Nothing changes at run time and nothing runs until the draft is published.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from django.contrib.auth.models import User

from pandaweb.assist.client import ModelUnavailable
from pandaweb.assist.services import assist_choose_element, assist_rank_candidates
from sessions.engine.healing import Candidate, Place, candidate_at, heal_candidates, place_of
from sessions.engine.pictures import outline_target
from sessions.engine.steps.base import StepBase
from sessions.engine.steps.language import Target
from sessions.models import Run, StepResult
from sessions.services.runstate import run_files_dir
from workflows import services as workflow_services
from workflows.models import WorkflowVersion
from workflows.schema import STEP_ADAPTER


class HealingUnavailable(Exception):
    """This step cannot be healed from here; the message says why, for people."""


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


def heal_proposal(run: Run, result: StepResult, field: str = "") -> HealProposal:
    """The candidates for one of a failed step's targets (its first when ``field`` is empty)."""
    if result.status != StepResult.Status.FAILED:
        raise HealingUnavailable("only a failed step is healed")
    steps = run.version.steps or []
    if result.index >= len(steps):
        raise HealingUnavailable("the run's version has no such step")
    step = STEP_ADAPTER.validate_python(steps[result.index])
    targets = {name: value for name, value in step.__dict__.items() if isinstance(value, Target)}
    if not targets:
        raise HealingUnavailable(f"a {step.label.lower()} step has no target to heal")
    chosen = field or next(iter(targets))
    if chosen not in targets:
        raise HealingUnavailable(f"step '{step.id}' has no target '{chosen}'")
    elements: list[dict[str, Any]] = (result.observation or {}).get("elements") or []
    was = _last_place(run, result, targets[chosen])
    candidates = heal_candidates(targets[chosen], elements, was=was)
    return HealProposal(run, result, step, targets, chosen, candidates)


def _last_place(run: Run, result: StepResult, target: Target) -> Place | None:
    """Where the target's element was on the page the step last acted on successfully (the page
    before it: the previous step's observation), in this workflow's most recent passing run."""
    passed = (
        StepResult.objects.filter(
            run__version__workflow_id=run.version.workflow_id,
            step_id=result.step_id,
            status=StepResult.Status.SUCCEEDED,
            index__gt=0,
        )
        .exclude(run_id=run.pk)
        .order_by("-run_id")
        .values_list("run_id", "index")
        .first()
    )
    if passed is None:
        return None
    run_id, index = passed
    before = (
        StepResult.objects.filter(run_id=run_id, index=index - 1)
        .values_list("observation", flat=True)
        .first()
    )
    elements = (before or {}).get("elements") or []
    return place_of(target, elements, f"when run #{run_id} passed")


def heal_ranked(proposal: HealProposal, *, user: User) -> HealProposal:
    """The same candidates in the order the configured model proposes (those it left out last).
    Raises ``ModelUnavailable`` when assistance is off or the model fails."""
    order = assist_rank_candidates(
        user=user,
        run_id=proposal.run.pk,
        step_kind=proposal.step.label.lower(),
        looked_for=proposal.target.describe(),
        candidates=proposal.candidates,
    )
    position = {number: place for place, number in enumerate(order)}
    ranked = sorted(proposal.candidates, key=lambda c: position.get(c.number, len(order)))
    return replace(proposal, candidates=ranked)


def heal_described(proposal: HealProposal, *, user: User, description: str) -> HealProposal:
    """The element of the step's page the configured model says ``description`` means, first
    among the candidates (a proposal like the others). Raises ``ModelUnavailable`` when
    assistance is off, the model fails, or it names no element of the page."""
    description = " ".join(description.split())[:300]
    if not description:
        raise ModelUnavailable("describe the element first")
    elements: list[dict[str, Any]] = (proposal.result.observation or {}).get("elements") or []
    number = assist_choose_element(
        user=user, run_id=proposal.run.pk, description=description, elements=elements
    )
    chosen = (
        candidate_at(proposal.target, elements, number, f"the model's choice for '{description}'")
        if number is not None
        else None
    )
    if chosen is None:
        raise ModelUnavailable(f"the model named no element of the page for '{description}'")
    others = [c for c in proposal.candidates if c.number != chosen.number]
    return replace(proposal, candidates=[chosen, *others])


def heal_apply(
    *,
    proposal: HealProposal,
    user: User,
    number: int | None = None,
    written: str = "",
    confirm: str = "",
) -> WorkflowVersion:
    """Put the candidate ``number`` (or the ``written`` target, in the editor's one-line form)
    into the workflow's draft. Raises ``workflow_services.WorkflowError`` in people's words."""
    if number is not None:
        chosen = next((c.target for c in proposal.candidates if c.number == number), None)
        if chosen is None:
            raise workflow_services.WorkflowError(f"element [{number}] is not a candidate")
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
        note=note[:500],
        confirm=confirm,
    )


def candidate_picture(proposal: HealProposal, number: int) -> bytes:
    """The failed step's screenshot with candidate ``number`` outlined (PNG)."""
    candidate = next((c for c in proposal.candidates if c.number == number), None)
    if candidate is None or candidate.box is None or not proposal.result.screenshot:
        raise HealingUnavailable("no picture of this element")
    path = run_files_dir(proposal.run.pk) / proposal.result.screenshot
    if not path.is_file():
        raise HealingUnavailable("the step's screenshot is gone (retention)")
    box = candidate.box
    return outline_target(path.read_bytes(), (box["x"], box["y"], box["width"], box["height"]))
