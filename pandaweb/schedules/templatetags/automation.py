from __future__ import annotations

from typing import Any

from django import template

from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability
from pandaweb.schedules import selectors
from workflows.models import Workflow, WorkflowVersion

register = template.Library()


@register.inclusion_tag("schedules/partials/_workflow_panel.html", takes_context=True)
def workflow_automation(context: dict[str, Any], workflow: Workflow) -> dict[str, Any]:
    """The schedules and batches of a workflow, for its page."""
    user = context["request"].user
    return {
        "request": context["request"],
        "csrf_token": context.get("csrf_token"),
        "workflow": workflow,
        "can_launch": user_can(user, Capability.LAUNCH_RUNS, team_id=workflow.team_id)
        and not workflow.archived,
        "published": workflow.versions.filter(status=WorkflowVersion.Status.PUBLISHED).exists(),
        "schedules": [
            {"schedule": s, "words": selectors.schedule_in_words(s)}
            for s in selectors.workflow_schedules(workflow)
        ],
        "batches": selectors.workflow_batches(workflow),
    }
