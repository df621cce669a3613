"""Who may decide an approval request: the one rule every way in (page, API, chat, MCP) asks."""

from __future__ import annotations

from django.contrib.auth.models import User

from approvals.models import ApprovalRequest
from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability, Role


def approval_refusal(user: User, approval: ApprovalRequest) -> str | None:
    """Why ``user`` may not decide ``approval`` (None when they may)."""
    run = approval.run
    # First: it is the most useful answer for a launcher watching their own run's request.
    if run.launched_by_id == user.pk:
        return "you launched this run: someone else has to approve it"
    if not user_can(user, Capability.DECIDE_APPROVALS):
        return "you are not allowed to decide approvals"
    admin = user.is_superuser or user.groups.filter(name=Role.ADMINS.value).exists()
    # An escalated request may also be decided by the group it was escalated to.
    deciders = [approval.reviewer_group]
    if approval.escalated_at and approval.escalation_group:
        deciders.append(approval.escalation_group)
    if not admin and not user.groups.filter(name__in=deciders).exists():
        return f"only members of {' or '.join(deciders)} decide this workflow's approvals"
    if run.version.author_id == user.pk and not approval.author_may_approve:
        return "you wrote this version of the workflow, which does not let its author approve"
    return None
