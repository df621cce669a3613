"""Who may decide an approval request: the one rule every way in (page, API, chat, MCP) asks."""

from __future__ import annotations

from collections.abc import Collection

from django.contrib.auth.models import User
from django.db.models import Q, QuerySet

from approvals.models import ApprovalRequest
from pandaweb.core.permissions import is_admin, people_with, user_can
from pandaweb.core.roles import Capability, Role


def _deciding_groups(approval: ApprovalRequest) -> list[str]:
    # An escalated request may also be decided by the group it was escalated to.
    deciders = [approval.reviewer_group]
    if approval.escalated_at and approval.escalation_group:
        deciders.append(approval.escalation_group)
    return deciders


def _in_groups(groups: list[str], team_id: int | None) -> Q:
    """Membership of ``groups`` as a condition on people: a Django group of that name, or for
    the Reviewers role a Reviewers membership in the run's team ``team_id``. A custom reviewer
    group stays a Django group; the team rule comes on top of it (``people_with``)."""
    condition = Q(groups__name__in=groups)
    if Role.REVIEWERS.value in groups:
        condition |= Q(
            team_memberships__team_id=team_id, team_memberships__role=Role.REVIEWERS.value
        )
    return condition


def approval_audience(
    approval: ApprovalRequest, *, groups: list[str], people: Collection[int] = ()
) -> QuerySet[User]:
    """The active people of ``groups``, and the ``people`` (ids) named, who belong to the run's
    team (they may decide its approvals or watch its runs): whom to tell of ``approval``. Nobody
    of another team hears of it, an assignee since removed from the team included; whether each
    may decide is the refusal's answer below."""
    team_id = approval.run.team_id
    in_groups = User.objects.filter(_in_groups(groups, team_id) | Q(pk__in=people)).values("pk")
    deciders = people_with(Capability.DECIDE_APPROVALS, team_id=team_id).values("pk")
    watchers = people_with(Capability.VIEW_RUNS, team_id=team_id).values("pk")
    return User.objects.filter(pk__in=in_groups).filter(Q(pk__in=deciders) | Q(pk__in=watchers))


def approval_refusal(user: User, approval: ApprovalRequest) -> str | None:
    """Why ``user`` may not decide ``approval`` (None when they may): they hold
    DECIDE_APPROVALS in the run's team and belong to its reviewer group there."""
    run = approval.run
    # First: it is the most useful answer for a launcher watching their own run's request.
    if run.launched_by_id == user.pk:
        return "you launched this run: someone else has to approve it"
    if not user_can(user, Capability.DECIDE_APPROVALS, team_id=run.team_id):
        if user_can(user, Capability.DECIDE_APPROVALS):
            return "you may not decide approvals of another team's runs"
        return "you are not allowed to decide approvals"
    admin = is_admin(user)
    deciders = _deciding_groups(approval)
    if (
        not admin
        and not User.objects.filter(_in_groups(deciders, run.team_id), pk=user.pk).exists()
    ):
        return f"only members of {' or '.join(deciders)} decide this workflow's approvals"
    if run.version.author_id == user.pk and not approval.author_may_approve:
        return "you wrote this version of the workflow, which does not let its author approve"
    return None
