"""What the Teams pages read."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db.models import Count, QuerySet

from pandaweb.core.models import Membership, Team
from pandaweb.core.permissions import is_admin


@dataclass(frozen=True)
class TeamRow:
    team: Team  # with ``people`` and ``workflow_count``
    my_roles: list[str]


def teams_listed(user: User) -> list[TeamRow]:
    """The teams ``user`` belongs to (every team for an admin), each with the roles they hold
    there, how many people and workflows it has."""
    teams = Team.objects.annotate(
        people=Count("memberships__user", distinct=True),
        workflow_count=Count("workflows", distinct=True),
    ).order_by("name")
    mine = Membership.objects.filter(user=user).select_related("team")
    if not is_admin(user):
        teams = teams.filter(pk__in=mine.values("team_id"))
    roles: dict[int, list[str]] = {}
    for membership in mine:
        roles.setdefault(membership.team_id, []).append(membership.get_role_display())
    return [TeamRow(team=team, my_roles=roles.get(team.pk, [])) for team in teams]


def team_members(team: Team) -> QuerySet[Membership]:
    return team.memberships.select_related("user").order_by("user__username", "role")
