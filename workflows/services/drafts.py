"""The bottom of the workflow services: the workflow's row lock, its draft, and the document a
draft would publish as. Every change of a workflow starts here; nothing here writes an audit
event of its own."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.contrib.auth.models import User
from pydantic import ValidationError

from pandaweb.core.models import Team
from workflows.fileformat import canonical_data
from workflows.models import Credential, Workflow, WorkflowVersion
from workflows.schema import WorkflowDocument
from workflows.services.errors import WorkflowError
from workflows.services.teams import refuse_outside_team


def lock_workflow(workflow_id: int, *, user: User) -> Workflow:
    """The workflow row, locked until the transaction ends: edits of one workflow serialize.
    Refused unless ``user`` authors workflows in its team: every change starts here."""
    workflow = Workflow.objects.select_for_update().get(pk=workflow_id)
    refuse_outside_team(user, workflow)
    return workflow


def refuse_archived(workflow: Workflow) -> None:
    if workflow.archived:
        raise WorkflowError("this workflow is archived; restore it before changing it")


def draft_get_or_create(workflow: Workflow) -> WorkflowVersion:
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


def editable_draft(workflow_id: int, *, user: User) -> tuple[Workflow, WorkflowVersion]:
    """The locked workflow and its draft, refusing an archived workflow: where every edit starts."""
    workflow = lock_workflow(workflow_id, user=user)
    refuse_archived(workflow)
    return workflow, draft_get_or_create(workflow)


def settings_of(workflow: Workflow) -> dict[str, Any]:
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


def identity_of(workflow: Workflow) -> dict[str, Any]:
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
        **identity_of(workflow),
        "settings": settings_of(workflow),
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


def credential_kinds(team: Team) -> dict[str, str]:
    """The kinds of the credentials ``team``'s workflows may use, by name."""
    return dict(Credential.objects.filter(team=team).values_list("name", "kind"))
