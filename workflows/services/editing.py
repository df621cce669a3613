"""Editing a draft: its steps (the run's and its session template's), the session template's
check, and its launch parameters. Each change locks the workflow row and writes one audit
event."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from pydantic import ValidationError

from pandaweb.audit.services import audit_record
from sessions.engine.steps.base import StepBase
from sessions.engine.steps.language import TEMPLATE, Target
from workflows.models import WorkflowVersion
from workflows.schema import SESSION_STEP_TYPES, STEP_ADAPTER, Parameter, SessionSpec
from workflows.services.drafts import editable_draft, lock_workflow
from workflows.services.errors import WorkflowError


def validate_step(data: dict[str, Any]) -> StepBase:
    """A single step on its own; raises WorkflowError with one message list per field."""
    try:
        step = STEP_ADAPTER.validate_python(data)
    except ValidationError as exc:
        errors: dict[str, list[str]] = {}
        for error in exc.errors():
            loc = [str(p) for p in error["loc"]]
            # Drop the union tag pydantic puts first ("click", …).
            field = loc[1] if len(loc) > 1 else (loc[0] if loc else "__all__")
            message = str(error["msg"]).removeprefix("Value error, ")
            if error["type"] == "missing":
                message = "this field is required"
            errors.setdefault(field, []).append(message)
        raise WorkflowError("invalid step", errors) from None
    assert isinstance(step, StepBase)
    return step


def _step_dump(step: StepBase) -> dict[str, Any]:
    data = step.model_dump(mode="json", exclude_defaults=True)
    return {"id": data.pop("id"), "type": data.pop("type"), **data}


@transaction.atomic
def step_save(
    *,
    workflow_id: int,
    user: User,
    data: dict[str, Any],
    index: int | None = None,
    session: bool = False,
) -> WorkflowVersion:
    """Add a step at the end (``index`` None) or replace the step at ``index`` in the draft;
    with ``session``, in the steps of the draft's session template (created if it has none)."""
    workflow, draft = editable_draft(workflow_id, user=user)
    step = _step_dump(validate_step(data))
    if session:
        _refuse_outside_session(step)
    steps = _steps_of(draft, session=session)
    others = [s.get("id") for i, s in enumerate(steps) if i != index]
    others += [s.get("id") for s in _steps_of(draft, session=not session)]
    if step["id"] in others:
        raise WorkflowError(
            "duplicate id", {"id": [f"another step already has the id '{step['id']}'"]}
        )
    if index is None:
        steps.append(step)
        before = None
        action = "workflow.step_added"
    else:
        _check_index(steps, index)
        before = steps[index]
        steps[index] = step
        action = "workflow.step_changed"
    _put_steps(draft, steps, session=session)
    audit_record(
        action=action,
        object_type="workflow",
        object_id=workflow.pk,
        team_id=workflow.team_id,
        actor=user,
        before=before,
        after=step,
        extra={
            "draft": draft.pk,
            "position": index if index is not None else len(steps) - 1,
            **({"session": True} if session else {}),
        },
    )
    return draft


@transaction.atomic
def step_insert(
    *, workflow_id: int, user: User, data: dict[str, Any], after: str = "", note: str = ""
) -> WorkflowVersion:
    """Insert a step into the draft's run steps right after the step with id ``after`` (first,
    when ``after`` is a session step; last, when it is empty). ``note`` says where the step
    came from, in the audit trail."""
    workflow, draft = editable_draft(workflow_id, user=user)
    step = _step_dump(validate_step(data))
    steps = _steps_of(draft, session=False)
    session_ids = [s.get("id") for s in _steps_of(draft, session=True)]
    if step["id"] in [s.get("id") for s in steps] + session_ids:
        raise WorkflowError(
            "duplicate id", {"id": [f"another step already has the id '{step['id']}'"]}
        )
    run_ids = [s.get("id") for s in steps]
    if not after:
        position = len(steps)
    elif after in run_ids:
        position = run_ids.index(after) + 1
    elif after in session_ids:
        position = 0
    else:
        raise WorkflowError(f"the draft has no step '{after}' any more: reload the page")
    steps.insert(position, step)
    _put_steps(draft, steps, session=False)
    audit_record(
        action="workflow.step_added",
        object_type="workflow",
        object_id=workflow.pk,
        team_id=workflow.team_id,
        actor=user,
        after=step,
        extra={"draft": draft.pk, "position": position, **({"note": note} if note else {})},
    )
    return draft


@transaction.atomic
def workflow_learn_dialog(
    *,
    workflow_id: int,
    user: User,
    step_id: str,
    target: dict[str, Any],
    dialog: str,
    seen: str,
) -> None:
    """Record that step ``step_id``, clicking ``target``, only opened the dialog ``dialog`` on
    the live page (``seen`` says where): its final-sounding words are no warning at publish
    while its target stays the same. Idempotent: the same fact again changes nothing."""
    workflow = lock_workflow(workflow_id, user=user)
    facts = dict(workflow.page_facts or {})
    known = dict(facts.get("opens_dialog") or {})
    fact = {"target": target, "dialog": dialog[:200], "seen": seen}
    if {k: v for k, v in (known.get(step_id) or {}).items() if k != "seen"} == {
        k: v for k, v in fact.items() if k != "seen"
    }:
        return
    known[step_id] = fact
    workflow.page_facts = {**facts, "opens_dialog": known}
    workflow.save(update_fields=["page_facts", "updated_at"])
    audit_record(
        action="workflow.page_learned",
        object_type="workflow",
        object_id=workflow.pk,
        team_id=workflow.team_id,
        # The person whose try on the live page showed it.
        actor=user,
        after={"step": step_id, "opens_dialog": fact},
    )


def _steps_of(draft: WorkflowVersion, *, session: bool) -> list[dict[str, Any]]:
    """A copy of the run's steps, or of the session template's (empty without one)."""
    if session:
        return list((draft.session or {}).get("steps", []))
    return list(draft.steps)


def _put_steps(draft: WorkflowVersion, steps: list[dict[str, Any]], *, session: bool) -> None:
    if not session:
        draft.steps = steps
        draft.save(update_fields=["steps", "updated_at"])
        return
    draft.session = {**(draft.session or {}), "steps": steps}
    draft.save(update_fields=["session", "updated_at"])


def _refuse_outside_session(step: dict[str, Any]) -> None:
    # The same rules as at publish, said where the step is typed.
    if step["type"] not in SESSION_STEP_TYPES:
        raise WorkflowError(
            "not a session step",
            {"type": [f"a session template only logs in; {step['type']} steps belong to the run"]},
        )
    if step.get("irreversible"):
        raise WorkflowError(
            "irreversible",
            {
                "irreversible": [
                    "session steps run on every bake without anyone's approval; an irreversible "
                    "step belongs to the run's steps"
                ]
            },
        )


def _check_index(items: list[Any], index: int) -> None:
    if not 0 <= index < len(items):
        raise WorkflowError("that step no longer exists; reload the page")


@transaction.atomic
def step_delete(
    *, workflow_id: int, user: User, index: int, step_id: str, session: bool = False
) -> WorkflowVersion:
    """Delete the step at ``index`` (of the session template with ``session``) if it is still
    ``step_id``.

    A page loaded before someone else reordered the steps cannot delete the wrong one.
    """
    workflow, draft = editable_draft(workflow_id, user=user)
    steps = _steps_of(draft, session=session)
    _check_step(steps, index, step_id)
    removed = steps.pop(index)
    _put_steps(draft, steps, session=session)
    audit_record(
        action="workflow.step_deleted",
        object_type="workflow",
        object_id=workflow.pk,
        team_id=workflow.team_id,
        actor=user,
        before=removed,
        extra={"draft": draft.pk, "position": index, **({"session": True} if session else {})},
    )
    return draft


def _check_step(steps: list[dict[str, Any]], index: int, step_id: str) -> None:
    _check_index(steps, index)
    if steps[index].get("id") != step_id:
        raise WorkflowError("the steps changed since this page was loaded; reload the page")


@transaction.atomic
def step_duplicate(
    *, workflow_id: int, user: User, index: int, step_id: str, session: bool = False
) -> WorkflowVersion:
    """Insert a copy of a step right after it, with a fresh id (``<id>-copy``, ``-copy-2``, …)."""
    workflow, draft = editable_draft(workflow_id, user=user)
    steps = _steps_of(draft, session=session)
    _check_step(steps, index, step_id)
    taken = {s["id"] for s in steps} | {s["id"] for s in _steps_of(draft, session=not session)}
    base = f"{step_id}-copy"[:63]
    new_id, n = base, 2
    while new_id in taken:
        new_id, n = f"{base[:59]}-{n}", n + 1
    copy = {**steps[index], "id": new_id}
    steps.insert(index + 1, copy)
    _put_steps(draft, steps, session=session)
    audit_record(
        action="workflow.step_added",
        object_type="workflow",
        object_id=workflow.pk,
        team_id=workflow.team_id,
        actor=user,
        after=copy,
        extra={"draft": draft.pk, "position": index + 1, "copied_from": step_id},
    )
    return draft


@transaction.atomic
def step_move(
    *,
    workflow_id: int,
    user: User,
    index: int,
    step_id: str,
    to_index: int,
    session: bool = False,
) -> WorkflowVersion:
    """Move a step to ``to_index`` (clamped to the list). Moving onto itself changes nothing."""
    workflow, draft = editable_draft(workflow_id, user=user)
    steps = _steps_of(draft, session=session)
    _check_step(steps, index, step_id)
    to_index = max(0, min(to_index, len(steps) - 1))
    if to_index == index:
        return draft
    steps.insert(to_index, steps.pop(index))
    _put_steps(draft, steps, session=session)
    audit_record(
        action="workflow.step_moved",
        object_type="workflow",
        object_id=workflow.pk,
        team_id=workflow.team_id,
        actor=user,
        before={"position": index},
        after={"position": to_index},
        extra={"draft": draft.pk, "step": step_id},
    )
    return draft


@transaction.atomic
def session_check_save(
    *,
    workflow_id: int,
    user: User,
    check_url: str,
    logged_in: dict[str, Any],
    rebake_every_hours: int,
) -> WorkflowVersion:
    """Set how the draft's session template tells a logged-in browser (creating the template,
    without steps yet, if the draft has none). Whether the URL's host is allowed is checked with
    the rest of the draft, at publish."""
    workflow, draft = editable_draft(workflow_id, user=user)
    errors: dict[str, list[str]] = {}
    try:
        target = Target.model_validate(logged_in).model_dump(exclude_defaults=True)
    except ValidationError as exc:
        errors["logged_in"] = [str(e["msg"]).removeprefix("Value error, ") for e in exc.errors()]
    check_url = check_url.strip()
    if not check_url:
        errors["check_url"] = ["say which page shows whether the browser is logged in"]
    elif TEMPLATE.search(check_url):
        errors["check_url"] = ["the check URL is the same for every run: it cannot use {{ … }}"]
    bounds = SessionSpec.model_fields["rebake_every_hours"].metadata
    low = next(b.ge for b in bounds if hasattr(b, "ge"))
    high = next(b.le for b in bounds if hasattr(b, "le"))
    if not low <= rebake_every_hours <= high:
        errors["rebake_every_hours"] = [f"between {low} and {high} hours"]
    if errors:
        raise WorkflowError("invalid session check", errors)
    before = {k: v for k, v in (draft.session or {}).items() if k != "steps"}
    after = {"check_url": check_url, "logged_in": target, "rebake_every_hours": rebake_every_hours}
    draft.session = {"steps": _steps_of(draft, session=True), **after}
    draft.save(update_fields=["session", "updated_at"])
    audit_record(
        action="workflow.session_changed",
        object_type="workflow",
        object_id=workflow.pk,
        team_id=workflow.team_id,
        actor=user,
        before=before or None,
        after=after,
        extra={"draft": draft.pk},
    )
    return draft


@transaction.atomic
def session_remove(*, workflow_id: int, user: User) -> WorkflowVersion:
    """Drop the draft's session template: runs of the next version log in with their own steps.
    Idempotent."""
    workflow, draft = editable_draft(workflow_id, user=user)
    if draft.session is None:
        return draft
    before = draft.session
    draft.session = None
    draft.save(update_fields=["session", "updated_at"])
    audit_record(
        action="workflow.session_removed",
        object_type="workflow",
        object_id=workflow.pk,
        team_id=workflow.team_id,
        actor=user,
        before=before,
        extra={"draft": draft.pk},
    )
    return draft


def validate_parameter(data: dict[str, Any]) -> Parameter:
    try:
        return Parameter.model_validate(data)
    except ValidationError as exc:
        errors: dict[str, list[str]] = {}
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else "__all__"
            errors.setdefault(field, []).append(str(error["msg"]).removeprefix("Value error, "))
        raise WorkflowError("invalid parameter", errors) from None


@transaction.atomic
def parameter_save(
    *, workflow_id: int, user: User, data: dict[str, Any], index: int | None = None
) -> WorkflowVersion:
    """Add (``index`` None) or replace a launch parameter of the draft."""
    workflow, draft = editable_draft(workflow_id, user=user)
    parameter = validate_parameter(data).model_dump(mode="json", exclude_defaults=True)
    parameters = list(draft.parameters)
    if parameter["name"] in [p["name"] for i, p in enumerate(parameters) if i != index]:
        raise WorkflowError("duplicate", {"name": [f"a parameter '{parameter['name']}' exists"]})
    before = None
    if index is None:
        parameters.append(parameter)
    else:
        _check_index(parameters, index)
        before = parameters[index]
        parameters[index] = parameter
    draft.parameters = parameters
    draft.save(update_fields=["parameters", "updated_at"])
    audit_record(
        action="workflow.parameter_saved",
        object_type="workflow",
        object_id=workflow.pk,
        team_id=workflow.team_id,
        actor=user,
        before=before,
        after=parameter,
        extra={"draft": draft.pk},
    )
    return draft


@transaction.atomic
def parameter_delete(*, workflow_id: int, user: User, index: int, name: str) -> WorkflowVersion:
    workflow, draft = editable_draft(workflow_id, user=user)
    parameters = list(draft.parameters)
    _check_index(parameters, index)
    if parameters[index].get("name") != name:
        raise WorkflowError("the parameters changed since this page was loaded; reload the page")
    removed = parameters.pop(index)
    draft.parameters = parameters
    draft.save(update_fields=["parameters", "updated_at"])
    audit_record(
        action="workflow.parameter_deleted",
        object_type="workflow",
        object_id=workflow.pk,
        team_id=workflow.team_id,
        actor=user,
        before=removed,
        extra={"draft": draft.pk},
    )
    return draft


@transaction.atomic
def step_target_heal(
    *,
    workflow_id: int,
    user: User,
    step_id: str,
    field: str,
    target: dict[str, Any],
    expected: dict[str, Any],
    note: str,
    run_id: int | None = None,
    confirm: str = "",
) -> WorkflowVersion:
    """Point a failed run's step target (``field``: ``target``, or a login's ``username``,
    ``password`` or ``submit``) at another element, in the draft (created from the latest
    version when there is none). ``note`` says why; it joins the draft's publish message and
    the audit trail, and nothing runs with the change until a person publishes. See
    ``step_target_set`` for ``expected`` and ``confirm``."""
    return step_target_set(
        workflow_id=workflow_id, user=user, step_id=step_id, field=field, target=target,
        expected=expected, confirm=confirm, action="workflow.step_healed", note=note,
        run_id=run_id,
    )  # fmt: skip


@transaction.atomic
def step_target_set(
    *,
    workflow_id: int,
    user: User,
    step_id: str,
    field: str,
    target: dict[str, Any],
    expected: dict[str, Any] | None,
    confirm: str = "",
    action: str = "workflow.step_target_picked",
    note: str = "",
    run_id: int | None = None,
    extra: dict[str, Any] | None = None,
) -> WorkflowVersion:
    """Set one target of a step of the draft (a run step's or a session step's), audited as
    ``action``. ``expected`` is the target the person saw (None: the step had none yet): a draft
    whose target changed since (an edit, another healing) is refused rather than overwritten. An
    irreversible step changes only with ``confirm`` equal to its id. ``note`` joins the draft's
    publish message. Not idempotent in its audit events; the target it sets is the same each
    time."""
    workflow, draft = editable_draft(workflow_id, user=user)
    session = False
    steps = _steps_of(draft, session=False)
    index = next((i for i, s in enumerate(steps) if s.get("id") == step_id), None)
    if index is None:
        session = True
        steps = _steps_of(draft, session=True)
        index = next((i for i, s in enumerate(steps) if s.get("id") == step_id), None)
    if index is None:
        raise WorkflowError(f"the draft has no step '{step_id}' any more: edit it by hand")
    before = steps[index]
    if field not in type(validate_step(before)).target_fields():
        raise WorkflowError(f"step '{step_id}' has no target '{field}'")
    had = Target.model_validate(before[field]) if before.get(field) else None
    if had != (Target.model_validate(expected) if expected else None):
        now = had.describe() if had is not None else "no element"
        raise WorkflowError(
            f"the draft's step '{step_id}' looks for {now} now, not what you saw: reload the page"
        )
    if before.get("irreversible") and confirm.strip() != step_id:
        raise WorkflowError(
            "confirm",
            {
                "confirm": [
                    f"step '{step_id}' is irreversible: type its id to confirm that the "
                    "reviewers will approve clicking the new target"
                ]
            },
        )
    step = _step_dump(validate_step({**before, field: target}))
    steps[index] = step
    _put_steps(draft, steps, session=session)
    if note:
        draft.message = "; ".join(m for m in (draft.message, note) if m)[:500]
        draft.save(update_fields=["message", "updated_at"])
    audit_record(
        action=action,
        object_type="workflow",
        object_id=workflow.pk,
        team_id=workflow.team_id,
        actor=user,
        before={field: before.get(field)},
        after={field: step[field]},
        extra={
            "draft": draft.pk,
            "step": step_id,
            **({"note": note} if note else {}),
            **(extra or {}),
        },
        run_id=run_id,
    )
    return draft
