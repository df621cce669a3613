"""A workflow's life outside its steps: creating it, the settings the next version carries (a
change of them is a change of the draft), archiving and restoring it."""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth.models import Group, User
from django.db import transaction
from pydantic import ValidationError

from pandaweb.audit.services import audit_record
from pandaweb.core.permissions import is_admin
from workflows.hosts import HostPatternError, parse_host_pattern
from workflows.models import Credential, Workflow, WorkflowVersion
from workflows.schema import (
    APPROVAL_REACH_OPTIONS,
    RECORDING_OPTIONS,
    ApprovalPolicy,
    WorkflowSettings,
)
from workflows.services.drafts import (
    draft_get_or_create,
    identity_of,
    lock_workflow,
    refuse_archived,
    settings_of,
)
from workflows.services.errors import WorkflowError
from workflows.services.teams import foreign_credentials, team_for_new


@transaction.atomic
def workflow_create(
    *,
    user: User,
    name: str,
    slug: str,
    description: str = "",
    reviewer_group: Group | None = None,
    allowed_hosts: list[str] | None = None,
    team: str | None = None,
) -> Workflow:
    """Create a workflow with an empty draft in the team ``team`` (a slug; see
    ``team_for_new`` when it is None). Not idempotent: a taken slug is refused."""
    joins = team_for_new(user, team)
    _refuse_reserved(slug)
    if Workflow.objects.filter(slug=slug).exists():
        raise WorkflowError("taken", {"slug": [f"a workflow with the slug '{slug}' exists"]})
    hosts = _valid_hosts(allowed_hosts or [])
    workflow = Workflow.objects.create(
        name=name,
        slug=slug,
        team=joins,
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
        team_id=joins.pk,
    )
    return workflow


@transaction.atomic
def workflow_start_draft(*, workflow_id: int, user: User) -> tuple[WorkflowVersion, bool]:
    """The workflow's draft, started from its latest published version when there is none (then
    True, and an audit event). Idempotent: an existing draft is returned as it is."""
    workflow = lock_workflow(workflow_id, user=user)
    refuse_archived(workflow)
    existing = workflow.versions.filter(status=WorkflowVersion.Status.DRAFT).first()
    if existing is not None:
        return existing, False
    draft = draft_get_or_create(workflow)
    audit_record(
        action="workflow.draft_started",
        object_type="workflow",
        object_id=workflow.pk,
        team_id=workflow.team_id,
        actor=user,
        after={"steps": len(draft.steps), "parameters": len(draft.parameters)},
        extra={"draft": draft.pk},
    )
    return draft, True


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
    approval_reach: dict[str, Any] | None = None,
    recording: dict[str, Any] | None = None,
    offer_as_tool: bool | None = None,
) -> Workflow:
    """Change the settings the next published version will carry. Published versions keep theirs,
    and runs keep using the latest published version: a change of the document (identity or
    settings) goes into the draft, started from the latest version when there is none, and
    applies once the draft is published. Saving unchanged settings starts no draft.

    ``approval_reach`` (the Slack channel and passkey options, ``APPROVAL_REACH_OPTIONS``) and
    ``recording`` (the filmstrip, ``RECORDING_OPTIONS``) replace those options whole; None leaves
    them unchanged. ``offer_as_tool`` (None: unchanged) is no part of a version: it applies at
    once to every published version; only an administrator changes it, since it hands the
    workflow to AI agents.
    """
    workflow = lock_workflow(workflow_id, user=user)
    refuse_archived(workflow)
    if offer_as_tool is not None and offer_as_tool != workflow.offer_as_tool and not is_admin(user):
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
                    **(workflow.approval_reach if approval_reach is None else approval_reach),
                },
                "credentials": [c.name for c in credentials],
                **(workflow.recording if recording is None else recording),
            }
        )
    except ValidationError as exc:
        raise WorkflowError("invalid settings", _settings_errors(exc)) from None
    foreign = foreign_credentials(workflow.team, [c.name for c in credentials])
    if foreign:
        raise WorkflowError("invalid settings", {"credentials": foreign})
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
    # Only what differs from the defaults, as an import stores them: the document (and its
    # exports) of a workflow that never set them stays what it was.
    workflow.approval_reach = checked.approval.model_dump(
        mode="json", include=set(APPROVAL_REACH_OPTIONS), exclude_defaults=True
    )
    workflow.recording = checked.model_dump(
        mode="json", include=set(RECORDING_OPTIONS), exclude_defaults=True
    )
    workflow.save()
    workflow.credentials.set(credentials)
    after = {
        **identity_of(workflow),
        "settings": settings_of(workflow),
        "offer_as_tool": workflow.offer_as_tool,
    }
    # The settings live on the workflow row until a version freezes them; without a draft there
    # would be nothing to publish, and runs would never see the change.
    versioned = {k: v for k, v in after.items() if k != "offer_as_tool"} != {
        k: v for k, v in before.items() if k != "offer_as_tool"
    }
    draft = draft_get_or_create(workflow) if versioned else None
    audit_record(
        action="workflow.settings_changed",
        object_type="workflow",
        object_id=workflow.pk,
        team_id=workflow.team_id,
        actor=user,
        before=_changed(before, after),
        after=_changed(after, before),
        extra={"draft": draft.pk} if draft is not None else None,
    )
    return workflow


# The settings form's field of each setting the schema names (the others keep their name).
_FORM_FIELDS = {
    "quorum": "approval_quorum",
    "expiry_minutes": "approval_expiry_minutes",
    "remind_before_minutes": "approval_remind_before_minutes",
    "escalate_after_minutes": "approval_escalate_after_minutes",
    "escalation_group": "approval_escalation_group",
    "slack_channel": "approval_slack_channel",
    "passkey_above_amount": "approval_passkey_above_amount",
    "passkey": "approval_passkey",
    "amount": "approval_fact_amount",
    "currency": "approval_fact_currency",
    "payee": "approval_fact_payee",
    "reference": "approval_fact_reference",
}


def _settings_errors(exc: ValidationError) -> dict[str, list[str]]:
    """The schema's refusals by form field, in the form's words: a rule that spans settings
    ("remind_before_minutes must be shorter than expiry_minutes") is said with the settings'
    titles, on the first setting it names."""
    titles = {
        name: f"“{info.title}”"
        for model in (WorkflowSettings, ApprovalPolicy)
        for name, info in model.model_fields.items()
        if info.title
    }
    # Longest first: passkey_above_amount before passkey.
    mentioned = re.compile("|".join(sorted(map(re.escape, titles), key=len, reverse=True)))
    errors: dict[str, list[str]] = {}
    for error in exc.errors():
        loc = [str(p) for p in error["loc"] if not isinstance(p, int)]
        # "passkey: above" is the file's way to say the form's choice.
        message = (
            str(error["msg"])
            .removeprefix("Value error, ")
            .replace("passkey: above", "“above an amount”")
        )
        field = loc[-1] if loc else "__all__"
        if field == "approval":
            first = mentioned.search(message)
            field = first.group(0) if first else "__all__"
        message = mentioned.sub(lambda m: titles[m.group(0)], message)
        errors.setdefault(_FORM_FIELDS.get(field, field), []).append(message)
    return errors


def _changed(mine: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in mine.items() if other.get(k) != v}


@transaction.atomic
def workflow_set_archived(*, workflow_id: int, user: User, archived: bool) -> Workflow:
    """Archive (hide from launch, freeze edits) or restore a workflow. Idempotent."""
    workflow = lock_workflow(workflow_id, user=user)
    if workflow.archived == archived:
        return workflow
    workflow.archived = archived
    workflow.save(update_fields=["archived", "updated_at"])
    audit_record(
        action="workflow.archived" if archived else "workflow.restored",
        object_type="workflow",
        object_id=workflow.pk,
        team_id=workflow.team_id,
        actor=user,
        before={"archived": not archived},
        after={"archived": archived},
    )
    return workflow
