"""A workflow's life outside its steps: creating it, the settings the next version carries,
archiving and restoring it."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group, User
from django.db import transaction
from pydantic import ValidationError

from pandaweb.audit.services import audit_record
from pandaweb.core.roles import Role
from workflows.hosts import HostPatternError, parse_host_pattern
from workflows.models import Credential, Workflow, WorkflowVersion
from workflows.schema import WorkflowSettings
from workflows.services.drafts import identity_of, lock_workflow, refuse_archived, settings_of
from workflows.services.errors import WorkflowError


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
        after={**identity_of(workflow), "settings": settings_of(workflow)},
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
    workflow = lock_workflow(workflow_id)
    refuse_archived(workflow)
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
        **identity_of(workflow),
        "settings": settings_of(workflow),
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
        **identity_of(workflow),
        "settings": settings_of(workflow),
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


@transaction.atomic
def workflow_set_archived(*, workflow_id: int, user: User, archived: bool) -> Workflow:
    """Archive (hide from launch, freeze edits) or restore a workflow. Idempotent."""
    workflow = lock_workflow(workflow_id)
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
