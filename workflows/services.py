"""Every change to workflows and credentials: one transaction, the workflow row locked, one audit
event. Views call these and nothing else writes."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone
from pydantic import ValidationError

from pandaweb.audit.services import audit_record
from pandaweb.core.roles import Role
from sessions.engine.steps.assertion import CHECK_KINDS
from sessions.engine.steps.base import Problem, StepBase
from sessions.engine.steps.language import TEMPLATE, Target
from workflows.fileformat import (
    DocumentError,
    LocatedProblem,
    canonical_data,
    dump_document,
    load_document,
    locate,
)
from workflows.hosts import HostPatternError, parse_host_pattern
from workflows.models import Credential, Workflow, WorkflowVersion
from workflows.schema import (
    APPROVAL_REACH_OPTIONS,
    RECORDING_OPTIONS,
    SESSION_STEP_TYPES,
    STEP_ADAPTER,
    STEP_TYPES,
    Parameter,
    SessionSpec,
    WorkflowDocument,
    WorkflowSettings,
    document_problems,
    irreversible_warnings,
)
from workflows.vault import Vault


class WorkflowError(Exception):
    """A change that was refused; ``field_errors`` maps form fields to messages."""

    def __init__(self, message: str, field_errors: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.field_errors = field_errors or {}


class PublishRefused(WorkflowError):
    def __init__(self, problems: list[str], warnings: list[str]) -> None:
        super().__init__("the draft cannot be published yet")
        self.problems = problems
        self.warnings = warnings


class ImportRefused(WorkflowError):
    def __init__(self, problems: list[LocatedProblem]) -> None:
        super().__init__("the file was not imported")
        self.problems = problems


# Locks and reads under lock ---------------------------------------------------------------------


def _lock_workflow(workflow_id: int) -> Workflow:
    """The workflow row, locked until the transaction ends: edits of one workflow serialize."""
    return Workflow.objects.select_for_update().get(pk=workflow_id)


def _draft(workflow: Workflow) -> WorkflowVersion:
    """The workflow's draft, created from the latest published version when there is none.

    Call with the workflow locked: the partial unique constraint would refuse a second draft, but
    the lock makes sure we never even try.
    """
    draft = workflow.versions.filter(status=WorkflowVersion.Status.DRAFT).first()
    if draft is not None:
        return draft
    latest = (
        workflow.versions.filter(status=WorkflowVersion.Status.PUBLISHED)
        .order_by("-number")
        .first()
    )
    return WorkflowVersion.objects.create(
        workflow=workflow,
        parameters=latest.parameters if latest else [],
        steps=latest.steps if latest else [],
        session=latest.session if latest else None,
    )


def _editable_draft(workflow_id: int) -> tuple[Workflow, WorkflowVersion]:
    """The locked workflow and its draft, refusing an archived workflow: where every edit starts."""
    workflow = _lock_workflow(workflow_id)
    _refuse_archived(workflow)
    return workflow, _draft(workflow)


def _settings_of(workflow: Workflow) -> dict[str, Any]:
    return {
        "allowed_hosts": list(workflow.allowed_hosts),
        "step_budget": workflow.step_budget,
        "run_ttl_minutes": workflow.run_ttl_minutes,
        "max_concurrent_runs": workflow.max_concurrent_runs,
        "approval": {
            "quorum": workflow.approval_quorum,
            "expiry_minutes": workflow.approval_expiry_minutes,
            "author_may_approve": workflow.author_may_approve,
            **_handover_of(workflow),
            **(workflow.approval_reach or {}),
        },
        "credentials": sorted(workflow.credentials.values_list("name", flat=True)),
        **(workflow.recording or {}),
    }


def _handover_of(workflow: Workflow) -> dict[str, Any]:
    """The reminder and escalation settings, only those set: a workflow without them keeps
    the document (and its exports) it always had."""
    handover: dict[str, Any] = {}
    if workflow.approval_remind_before_minutes:
        handover["remind_before_minutes"] = workflow.approval_remind_before_minutes
    if workflow.approval_escalate_after_minutes:
        handover["escalate_after_minutes"] = workflow.approval_escalate_after_minutes
    if workflow.approval_escalation_group:
        handover["escalation_group"] = workflow.approval_escalation_group
    return handover


def _identity_of(workflow: Workflow) -> dict[str, Any]:
    return {
        "name": workflow.name,
        "slug": workflow.slug,
        "description": workflow.description,
        "reviewer_group": workflow.reviewer_group.name,
    }


def document_data(workflow: Workflow, version: WorkflowVersion) -> dict[str, Any]:
    """The file a draft would publish as (settings come from the workflow)."""
    data = {
        "pandaweb": 1,
        **_identity_of(workflow),
        "settings": _settings_of(workflow),
        "parameters": version.parameters,
        "steps": version.steps,
    }
    if version.session is not None:
        data["session"] = version.session
    return data


def draft_canonical_data(workflow: Workflow, version: WorkflowVersion) -> dict[str, Any]:
    """The draft as it would be published (defaults left out), so that comparing it with a
    published version shows real changes only. A draft that does not validate yet is shown raw."""
    data = document_data(workflow, version)
    try:
        return canonical_data(WorkflowDocument.model_validate(data))
    except ValidationError:
        return data


def content_hash(document: WorkflowDocument) -> str:
    canonical = json.dumps(canonical_data(document), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def credential_kinds() -> dict[str, str]:
    return dict(Credential.objects.values_list("name", "kind"))


# Workflows --------------------------------------------------------------------------------------


@transaction.atomic
def workflow_create(
    *,
    user: User,
    name: str,
    slug: str,
    description: str = "",
    reviewer_group: Group | None = None,
    allowed_hosts: list[str] | None = None,
) -> Workflow:
    """Create a workflow with an empty draft. Not idempotent: a taken slug is refused."""
    _refuse_reserved(slug)
    if Workflow.objects.filter(slug=slug).exists():
        raise WorkflowError("taken", {"slug": [f"a workflow with the slug '{slug}' exists"]})
    hosts = _valid_hosts(allowed_hosts or [])
    workflow = Workflow.objects.create(
        name=name,
        slug=slug,
        description=description,
        owner=user,
        reviewer_group=reviewer_group or Group.objects.get(name="Reviewers"),
        allowed_hosts=hosts,
    )
    WorkflowVersion.objects.create(workflow=workflow)
    audit_record(
        action="workflow.created",
        object_type="workflow",
        object_id=workflow.pk,
        actor=user,
        after={**_identity_of(workflow), "settings": _settings_of(workflow)},
    )
    return workflow


# Words the workflow URLs use for pages of their own.
RESERVED_SLUGS = frozenset({"new", "import", "credentials"})


def _refuse_reserved(slug: str) -> None:
    if slug in RESERVED_SLUGS:
        raise WorkflowError("reserved", {"slug": [f"'{slug}' is reserved; choose another slug"]})


def _valid_hosts(hosts: list[str]) -> list[str]:
    normalized, errors = [], []
    for host in hosts:
        try:
            normalized.append(str(parse_host_pattern(host)))
        except HostPatternError as exc:
            errors.append(str(exc))
    if errors:
        raise WorkflowError("invalid hosts", {"allowed_hosts": errors})
    return normalized


@transaction.atomic
def workflow_update_settings(
    *,
    workflow_id: int,
    user: User,
    name: str,
    description: str,
    reviewer_group: Group,
    allowed_hosts: list[str],
    step_budget: int,
    run_ttl_minutes: int,
    approval_quorum: int,
    approval_expiry_minutes: int,
    author_may_approve: bool,
    credentials: list[Credential],
    max_concurrent_runs: int | None = None,
    approval_remind_before_minutes: int = 0,
    approval_escalate_after_minutes: int = 0,
    approval_escalation_group: str = "",
    offer_as_tool: bool | None = None,
) -> Workflow:
    """Change the settings the next published version will carry. Published versions keep theirs.

    ``offer_as_tool`` (None: unchanged) applies at once to every published version; only an
    administrator changes it, since it hands the workflow to AI agents.
    """
    workflow = _lock_workflow(workflow_id)
    _refuse_archived(workflow)
    if (
        offer_as_tool is not None
        and offer_as_tool != workflow.offer_as_tool
        and not (user.is_superuser or user.groups.filter(name=Role.ADMINS.value).exists())
    ):
        raise WorkflowError(
            "invalid settings",
            {"offer_as_tool": ["Only an administrator offers a workflow to AI agents."]},
        )
    try:
        checked = WorkflowSettings.model_validate(
            {
                "allowed_hosts": allowed_hosts,
                "step_budget": step_budget,
                "run_ttl_minutes": run_ttl_minutes,
                "max_concurrent_runs": max_concurrent_runs or workflow.max_concurrent_runs,
                "approval": {
                    "quorum": approval_quorum,
                    "expiry_minutes": approval_expiry_minutes,
                    "author_may_approve": author_may_approve,
                    "remind_before_minutes": approval_remind_before_minutes,
                    "escalate_after_minutes": approval_escalate_after_minutes,
                    "escalation_group": approval_escalation_group,
                    **(workflow.approval_reach or {}),
                },
                "credentials": [c.name for c in credentials],
                **(workflow.recording or {}),
            }
        )
    except ValidationError as exc:
        raise WorkflowError("invalid settings", _settings_errors(exc)) from None
    before = {
        **_identity_of(workflow),
        "settings": _settings_of(workflow),
        "offer_as_tool": workflow.offer_as_tool,
    }
    if offer_as_tool is not None:
        workflow.offer_as_tool = offer_as_tool
    workflow.name = name
    workflow.description = description
    workflow.reviewer_group = reviewer_group
    workflow.allowed_hosts = checked.allowed_hosts
    workflow.step_budget = checked.step_budget
    workflow.run_ttl_minutes = checked.run_ttl_minutes
    workflow.max_concurrent_runs = checked.max_concurrent_runs
    workflow.approval_quorum = checked.approval.quorum
    workflow.approval_expiry_minutes = checked.approval.expiry_minutes
    workflow.author_may_approve = checked.approval.author_may_approve
    workflow.approval_remind_before_minutes = checked.approval.remind_before_minutes
    workflow.approval_escalate_after_minutes = checked.approval.escalate_after_minutes
    workflow.approval_escalation_group = checked.approval.escalation_group
    workflow.save()
    workflow.credentials.set(credentials)
    after = {
        **_identity_of(workflow),
        "settings": _settings_of(workflow),
        "offer_as_tool": workflow.offer_as_tool,
    }
    audit_record(
        action="workflow.settings_changed",
        object_type="workflow",
        object_id=workflow.pk,
        actor=user,
        before=_changed(before, after),
        after=_changed(after, before),
    )
    return workflow


def _settings_errors(exc: ValidationError) -> dict[str, list[str]]:
    names = {
        "quorum": "approval_quorum",
        "expiry_minutes": "approval_expiry_minutes",
        "remind_before_minutes": "approval_remind_before_minutes",
        "escalate_after_minutes": "approval_escalate_after_minutes",
        "escalation_group": "approval_escalation_group",
    }
    errors: dict[str, list[str]] = {}
    for error in exc.errors():
        loc = [str(p) for p in error["loc"]]
        field = names.get(loc[-1], loc[1] if loc[0] == "approval" and len(loc) > 1 else loc[0])
        field = names.get(field, field)
        errors.setdefault(field, []).append(str(error["msg"]).removeprefix("Value error, "))
    return errors


def _changed(mine: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in mine.items() if other.get(k) != v}


def _refuse_archived(workflow: Workflow) -> None:
    if workflow.archived:
        raise WorkflowError("this workflow is archived; restore it before changing it")


@transaction.atomic
def workflow_set_archived(*, workflow_id: int, user: User, archived: bool) -> Workflow:
    """Archive (hide from launch, freeze edits) or restore a workflow. Idempotent."""
    workflow = _lock_workflow(workflow_id)
    if workflow.archived == archived:
        return workflow
    workflow.archived = archived
    workflow.save(update_fields=["archived", "updated_at"])
    audit_record(
        action="workflow.archived" if archived else "workflow.restored",
        object_type="workflow",
        object_id=workflow.pk,
        actor=user,
        before={"archived": not archived},
        after={"archived": archived},
    )
    return workflow


# Steps and parameters of the draft --------------------------------------------------------------


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
    workflow, draft = _editable_draft(workflow_id)
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
    workflow, draft = _editable_draft(workflow_id)
    steps = _steps_of(draft, session=session)
    _check_step(steps, index, step_id)
    removed = steps.pop(index)
    _put_steps(draft, steps, session=session)
    audit_record(
        action="workflow.step_deleted",
        object_type="workflow",
        object_id=workflow.pk,
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
    workflow, draft = _editable_draft(workflow_id)
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
    workflow, draft = _editable_draft(workflow_id)
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
    workflow, draft = _editable_draft(workflow_id)
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
    workflow, draft = _editable_draft(workflow_id)
    if draft.session is None:
        return draft
    before = draft.session
    draft.session = None
    draft.save(update_fields=["session", "updated_at"])
    audit_record(
        action="workflow.session_removed",
        object_type="workflow",
        object_id=workflow.pk,
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
    workflow, draft = _editable_draft(workflow_id)
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
        actor=user,
        before=before,
        after=parameter,
        extra={"draft": draft.pk},
    )
    return draft


@transaction.atomic
def parameter_delete(*, workflow_id: int, user: User, index: int, name: str) -> WorkflowVersion:
    workflow, draft = _editable_draft(workflow_id)
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
        actor=user,
        before=removed,
        extra={"draft": draft.pk},
    )
    return draft


# Publishing -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DraftReview:
    """What stands between a draft and publishing it."""

    problems: list[str]
    warnings: list[str]
    document: WorkflowDocument | None


def draft_review(workflow: Workflow, draft: WorkflowVersion) -> DraftReview:
    data = document_data(workflow, draft)
    try:
        document = WorkflowDocument.model_validate(data)
    except ValidationError as exc:
        messages = []
        for error in exc.errors():
            problem = Problem(
                path=tuple(p for p in error["loc"] if p not in _TAGS),
                message=str(error["msg"]).removeprefix("Value error, "),
            )
            where = problem.where(draft.steps, session_steps=(draft.session or {}).get("steps"))
            messages.append(f"{where}: {problem.message}")
        return DraftReview(problems=messages, warnings=[], document=None)
    problems = document_problems(document, credential_kinds=credential_kinds())
    if not document.steps:
        problems.append(Problem(path=("steps",), message="a workflow needs at least one step"))
    warnings = irreversible_warnings(list(document.steps))
    steps = list(document.steps)
    session_steps = list(document.session.steps) if document.session else None
    return DraftReview(
        problems=[f"{p.where(steps, session_steps=session_steps)}: {p.message}" for p in problems],
        warnings=[f"{w.where(steps)}: {w.message}" for w in warnings],
        document=document,
    )


# The discriminator values pydantic puts in an error's location (not a key of the document).
_TAGS = frozenset((*STEP_TYPES, *CHECK_KINDS))


@transaction.atomic
def workflow_publish(
    *, workflow_id: int, user: User, message: str, accept_warnings: bool = False
) -> WorkflowVersion:
    """Turn the draft into the next numbered, immutable version.

    Refused while the draft has problems, and while it has warnings (a click that reads like
    "pay" but is not irreversible) unless ``accept_warnings``. Not idempotent: publishing twice
    needs a new draft in between (there is none right after publishing).
    """
    workflow = _lock_workflow(workflow_id)
    _refuse_archived(workflow)
    draft = workflow.versions.filter(status=WorkflowVersion.Status.DRAFT).first()
    if draft is None:
        raise WorkflowError("there is no draft to publish; change something first")
    message = message.strip()
    if not message:
        raise WorkflowError("message", {"message": ["say what changed in this version"]})
    review = draft_review(workflow, draft)
    if review.problems or (review.warnings and not accept_warnings):
        raise PublishRefused(review.problems, review.warnings)
    assert review.document is not None
    number = (workflow.versions.aggregate(top=Max("number"))["top"] or 0) + 1
    draft.status = WorkflowVersion.Status.PUBLISHED
    draft.number = number
    draft.document = canonical_data(review.document)
    draft.content_hash = content_hash(review.document)
    draft.author = user
    draft.message = message
    draft.published_at = timezone.now()
    draft.save()
    audit_record(
        action="workflow.published",
        object_type="workflow",
        object_id=workflow.pk,
        actor=user,
        after={"version": number, "content_hash": draft.content_hash, "message": message},
        extra={"version_id": draft.pk, "accepted_warnings": review.warnings},
    )
    return draft


# Import and export ------------------------------------------------------------------------------


@transaction.atomic
def workflow_import(*, user: User, text: str | bytes) -> Workflow:
    """Make a draft from a workflow file: a new workflow, or a new draft of the one with its slug.

    All or nothing: any problem refuses the whole file and nothing is saved. Credentials are
    matched by name and must already exist.
    """
    try:
        document = load_document(text)
    except DocumentError as exc:
        raise ImportRefused(exc.problems) from None
    source = text.decode("utf-8") if isinstance(text, bytes) else text
    problems = document_problems(document, credential_kinds=credential_kinds())
    if document.slug in RESERVED_SLUGS:
        problems.append(Problem(path=("slug",), message=f"'{document.slug}' is a reserved slug"))
    group = Group.objects.filter(name=document.reviewer_group).first()
    if group is None:
        problems.append(
            Problem(
                path=("reviewer_group",),
                message=f"there is no group named '{document.reviewer_group}'",
            )
        )
    if problems:
        session_steps = list(document.session.steps) if document.session else None
        raise ImportRefused(locate(problems, source, list(document.steps), session_steps))
    assert group is not None
    existing = Workflow.objects.filter(slug=document.slug).first()
    if existing is None:
        workflow = Workflow.objects.create(
            name=document.name, slug=document.slug, owner=user, reviewer_group=group
        )
        before = None
    else:
        workflow = _lock_workflow(existing.pk)
        _refuse_archived(workflow)
        before = {**_identity_of(workflow), "settings": _settings_of(workflow)}
    data = canonical_data(document)
    workflow.name = document.name
    workflow.description = document.description
    workflow.reviewer_group = group
    workflow.allowed_hosts = list(document.settings.allowed_hosts)
    workflow.step_budget = document.settings.step_budget
    workflow.run_ttl_minutes = document.settings.run_ttl_minutes
    workflow.max_concurrent_runs = document.settings.max_concurrent_runs
    workflow.approval_quorum = document.settings.approval.quorum
    workflow.approval_expiry_minutes = document.settings.approval.expiry_minutes
    workflow.author_may_approve = document.settings.approval.author_may_approve
    workflow.approval_remind_before_minutes = document.settings.approval.remind_before_minutes
    workflow.approval_escalate_after_minutes = document.settings.approval.escalate_after_minutes
    workflow.approval_escalation_group = document.settings.approval.escalation_group
    workflow.approval_reach = document.settings.approval.model_dump(
        mode="json", include=set(APPROVAL_REACH_OPTIONS), exclude_defaults=True
    )
    workflow.recording = document.settings.model_dump(
        mode="json", include=set(RECORDING_OPTIONS), exclude_defaults=True
    )
    workflow.save()
    workflow.credentials.set(Credential.objects.filter(name__in=document.settings.credentials))
    draft = _draft(workflow)
    draft.parameters = data.get("parameters", [])
    draft.steps = data.get("steps", [])
    draft.session = data.get("session")
    draft.save(update_fields=["parameters", "steps", "session", "updated_at"])
    audit_record(
        action="workflow.imported",
        object_type="workflow",
        object_id=workflow.pk,
        actor=user,
        before=before,
        after={
            "slug": workflow.slug,
            "steps": len(draft.steps),
            "parameters": len(draft.parameters),
            **({"session_steps": len(draft.session["steps"])} if draft.session else {}),
        },
        extra={"draft": draft.pk, "sha256": hashlib.sha256(source.encode()).hexdigest()},
    )
    return workflow


@transaction.atomic
def version_export(
    *, version_id: int, user: User, fmt: Literal["yaml", "json"]
) -> tuple[WorkflowVersion, str]:
    """The file of a published version (credentials by name only). Writes an audit event."""
    version = WorkflowVersion.objects.select_related("workflow").get(
        pk=version_id, status=WorkflowVersion.Status.PUBLISHED
    )
    document = WorkflowDocument.model_validate(version.document)
    text = dump_document(document, fmt)
    audit_record(
        action="workflow.exported",
        object_type="workflow",
        object_id=version.workflow_id,
        actor=user,
        after={"version": version.number, "format": fmt},
        extra={"version_id": version.pk, "sha256": hashlib.sha256(text.encode()).hexdigest()},
    )
    return version, text


# Credentials ------------------------------------------------------------------------------------


def vault() -> Vault:
    return Vault(settings.CREDENTIAL_KEYS)


def _credential_payload(kind: str, values: dict[str, str]) -> dict[str, str]:
    """Check a credential's fields for its kind; messages never repeat the value."""
    errors: dict[str, list[str]] = {}

    def need(field: str, limit: int) -> str:
        value = values.get(field, "")
        if not value:
            errors.setdefault(field, []).append("this field is required")
        elif len(value) > limit:
            errors.setdefault(field, []).append(f"at most {limit} characters")
        return value

    if kind == Credential.Kind.USERNAME_PASSWORD:
        payload = {"username": need("username", 300), "password": need("password", 1000)}
    elif kind == Credential.Kind.TOTP:
        seed = need("seed", 200).replace(" ", "").upper()
        if seed:
            try:
                base64.b32decode(seed + "=" * (-len(seed) % 8))
            except (binascii.Error, ValueError):
                errors.setdefault("seed", []).append("not a base32 TOTP seed (letters A–Z, 2–7)")
        payload = {"seed": seed}
    elif kind == Credential.Kind.API_TOKEN:
        payload = {"token": need("token", 4000)}
    else:
        errors["kind"] = ["unknown kind"]
        payload = {}
    if errors:
        raise WorkflowError("invalid credential", errors)
    return payload


@transaction.atomic
def credential_create(
    *, user: User, name: str, kind: str, description: str, values: dict[str, str]
) -> Credential:
    """Store a new secret encrypted. The audit event names it, never its value."""
    payload = _credential_payload(kind, values)
    try:
        with transaction.atomic():
            credential = Credential.objects.create(
                name=name,
                kind=kind,
                description=description,
                ciphertext=vault().seal(payload),
                created_by=user,
                value_changed_at=timezone.now(),
            )
    except IntegrityError:
        raise WorkflowError("taken", {"name": [f"a credential named '{name}' exists"]}) from None
    audit_record(
        action="credential.created",
        object_type="credential",
        object_id=credential.pk,
        actor=user,
        after={"name": name, "kind": kind, "description": description},
    )
    return credential


@transaction.atomic
def credential_replace_value(
    *, credential_id: int, user: User, values: dict[str, str]
) -> Credential:
    """Replace a secret's value (the portal password changed). Its name and scope stay."""
    credential = Credential.objects.select_for_update().get(pk=credential_id)
    credential.ciphertext = vault().seal(_credential_payload(credential.kind, values))
    credential.value_changed_at = timezone.now()
    credential.save(update_fields=["ciphertext", "value_changed_at"])
    audit_record(
        action="credential.value_replaced",
        object_type="credential",
        object_id=credential.pk,
        actor=user,
        after={"name": credential.name},
    )
    return credential


@transaction.atomic
def credentials_reencrypt(*, actor: User | None = None) -> int:
    """Re-encrypt every credential with the newest key, so older keys can be retired.

    Idempotent. Fails as a whole (nothing changes) if any credential cannot be decrypted.
    """
    box = vault()
    count = 0
    for credential in Credential.objects.select_for_update().order_by("pk"):
        credential.ciphertext = box.rotate(credential.ciphertext)
        credential.save(update_fields=["ciphertext"])
        count += 1
    audit_record(
        action="credential.keys_rotated",
        object_type="credential",
        object_id="*",
        actor=actor,
        after={"credentials": count, "keys_configured": len(settings.CREDENTIAL_KEYS)},
    )
    return count
