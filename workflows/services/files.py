"""Workflow files: importing one as a draft (all or nothing) and exporting a published
version."""

from __future__ import annotations

import hashlib
from typing import Literal

from django.contrib.auth.models import Group, User
from django.db import transaction

from pandaweb.audit.services import audit_record
from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability
from sessions.engine.steps.base import Problem
from workflows.fileformat import (
    DocumentError,
    LocatedProblem,
    canonical_data,
    dump_document,
    load_document,
    locate,
)
from workflows.models import Credential, Workflow, WorkflowVersion
from workflows.schema import (
    APPROVAL_REACH_OPTIONS,
    RECORDING_OPTIONS,
    WorkflowDocument,
    document_problems,
)
from workflows.services.drafts import (
    credential_kinds,
    draft_canonical_data,
    draft_get_or_create,
    identity_of,
    lock_workflow,
    refuse_archived,
    settings_of,
)
from workflows.services.errors import WorkflowError
from workflows.services.lifecycle import RESERVED_SLUGS
from workflows.services.teams import refuse_outside_team, team_for_new


class ImportRefused(WorkflowError):
    def __init__(self, problems: list[LocatedProblem]) -> None:
        super().__init__("the file was not imported")
        self.problems = problems


class ImportUnchanged(WorkflowError):
    """The file is the workflow's latest version, and there is no draft: nothing to import."""

    def __init__(self, workflow: Workflow, version: int) -> None:
        super().__init__(f"nothing changed: '{workflow.name}' v{version} is this file already")
        self.workflow = workflow
        self.version = version


@transaction.atomic
def workflow_import(*, user: User, text: str | bytes, team: str | None = None) -> Workflow:
    """Make a draft from a workflow file: a new workflow, or a new draft of the one with its slug.

    All or nothing: any problem refuses the whole file and nothing is saved. Credentials are
    matched by name, must already exist and be the workflow's team's. A new workflow joins the
    team ``team`` (a slug; see ``team_for_new`` when None); a new draft of an existing workflow
    keeps its team (``team`` naming another is refused) and needs authoring rights there.
    """
    try:
        document = load_document(text)
    except DocumentError as exc:
        raise ImportRefused(exc.problems) from None
    source = text.decode("utf-8") if isinstance(text, bytes) else text
    problems: list[Problem] = []
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
    existing = Workflow.objects.filter(slug=document.slug).select_related("team").first()
    if existing is not None and not user_can(
        user, Capability.VIEW_WORKFLOWS, team_id=existing.team_id
    ):
        # Another team's workflow tells this person no more than a new workflow's taken slug.
        problems.append(
            Problem(path=("slug",), message=f"a workflow with the slug '{document.slug}' exists")
        )
        existing = None
    if existing is not None:
        refuse_outside_team(user, existing)
        if team and team != existing.team.slug:
            message = f"'{existing.slug}' is {existing.team}'s workflow, not {team}'s"
            raise WorkflowError(message, {"team": [message]})
    joins = existing.team if existing is not None else team_for_new(user, team)
    # The team's own credentials only: another team's is named as a missing one.
    problems = document_problems(document, credential_kinds=credential_kinds(joins)) + problems
    if problems:
        session_steps = list(document.session.steps) if document.session else None
        raise ImportRefused(locate(problems, source, list(document.steps), session_steps))
    assert group is not None
    if existing is None:
        workflow = Workflow.objects.create(
            name=document.name, slug=document.slug, team=joins, owner=user, reviewer_group=group
        )
        before = None
    else:
        workflow = lock_workflow(existing.pk, user=user)
        refuse_archived(workflow)
        _refuse_unchanged(workflow, document)
        before = {**identity_of(workflow), "settings": settings_of(workflow)}
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
    draft = draft_get_or_create(workflow)
    draft.parameters = data.get("parameters", [])
    draft.steps = data.get("steps", [])
    draft.session = data.get("session")
    draft.save(update_fields=["parameters", "steps", "session", "updated_at"])
    audit_record(
        action="workflow.imported",
        object_type="workflow",
        object_id=workflow.pk,
        team_id=workflow.team_id,
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


def _refuse_unchanged(workflow: Workflow, document: WorkflowDocument) -> None:
    """A file equal to the latest version would only make a draft that publishes the same
    content again: say so instead. With a draft, the file replaces the draft as always."""
    if workflow.versions.filter(status=WorkflowVersion.Status.DRAFT).exists():
        return
    latest = (
        workflow.versions.filter(status=WorkflowVersion.Status.PUBLISHED)
        .order_by("-number")
        .first()
    )
    # The workflow's settings may have changed since that version: then the file restores them.
    if latest is not None and draft_canonical_data(workflow, latest) == canonical_data(document):
        assert latest.number is not None
        raise ImportUnchanged(workflow, latest.number)


@transaction.atomic
def version_export(
    *, version_id: int, user: User, fmt: Literal["yaml", "json"]
) -> tuple[WorkflowVersion, str]:
    """The file of a published version (credentials by name only). Writes an audit event.
    Refused for someone who may not see its team's workflows."""
    version = WorkflowVersion.objects.select_related("workflow__team").get(
        pk=version_id, status=WorkflowVersion.Status.PUBLISHED
    )
    if not user_can(user, Capability.VIEW_WORKFLOWS, team_id=version.workflow.team_id):
        raise WorkflowError(f"you may not read {version.workflow.team}'s workflows")
    document = WorkflowDocument.model_validate(version.document)
    text = dump_document(document, fmt)
    audit_record(
        action="workflow.exported",
        object_type="workflow",
        object_id=version.workflow_id,
        team_id=version.workflow.team_id,
        actor=user,
        after={"version": version.number, "format": fmt},
        extra={"version_id": version.pk, "sha256": hashlib.sha256(text.encode()).hexdigest()},
    )
    return version, text
