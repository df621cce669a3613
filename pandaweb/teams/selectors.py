"""What the Teams pages (and the API's teams) read."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db.models import Count, QuerySet
from django.http import Http404

from pandaweb.core.models import Membership, Team
from pandaweb.core.permissions import access, is_admin


@dataclass(frozen=True)
class TeamRow:
    team: Team  # with ``people`` and ``workflow_count``
    roles: list[str]  # the roles held there, as memberships name them (Operators, Reviewers…)

    @property
    def my_roles(self) -> list[str]:
        """The roles as the page names them (Operator, Reviewer…)."""
        return [Membership.TeamRole(role).label for role in self.roles]


def _teams_seen(user: User) -> QuerySet[Team]:
    teams = Team.objects.annotate(
        people=Count("memberships__user", distinct=True),
        workflow_count=Count("workflows", distinct=True),
    ).order_by("name")
    if not is_admin(user):
        teams = teams.filter(pk__in=Membership.objects.filter(user=user).values("team_id"))
    limited = access(user).team
    # A token limited to one team reaches no other: not even the name of another of its
    # owner's teams.
    return teams if limited is None else teams.filter(pk=limited)


def _rows(user: User, teams: QuerySet[Team]) -> list[TeamRow]:
    found = list(teams)
    roles: dict[int, list[str]] = {}
    mine = Membership.objects.filter(user=user, team__in=[team.pk for team in found])
    for team_id, role in mine.order_by("role").values_list("team_id", "role"):
        roles.setdefault(team_id, []).append(role)
    return [TeamRow(team=team, roles=roles.get(team.pk, [])) for team in found]


def teams_listed(user: User) -> list[TeamRow]:
    """The teams ``user`` belongs to (every team for an admin; for a token limited to one team,
    that one), each with the roles they hold there, how many people and workflows it has."""
    return _rows(user, _teams_seen(user))


def team_seen(user: User, slug: str) -> TeamRow:
    """The team ``slug`` as ``teams_listed`` shows it to ``user``; Http404 for one it leaves
    out, as for a slug no team has."""
    rows = _rows(user, _teams_seen(user).filter(slug=slug))
    if not rows:
        raise Http404("no such team")
    return rows[0]


def team_members(team: Team) -> QuerySet[Membership]:
    return team.memberships.select_related("user").order_by("user__username", "role")
