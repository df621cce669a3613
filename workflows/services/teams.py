"""The team rule of workflows and credentials: who may change a team's workflows, which team
a new workflow or credential joins, and that a workflow uses its own team's credentials only."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NoReturn

from django.contrib.auth.models import User

from pandaweb.core.models import Team, default_team_id
from pandaweb.core.permissions import teams_where, user_can
from pandaweb.core.roles import Capability
from workflows.models import Credential, Workflow
from workflows.services.errors import NotYourTeam, WorkflowError


def refuse_outside_team(user: User, workflow: Workflow) -> None:
    """Every change of a workflow asks this (page, API, MCP and scratch sessions alike)."""
    if not user_can(user, Capability.AUTHOR_WORKFLOWS, team_id=workflow.team_id):
        raise NotYourTeam(f"you may not change {workflow.team}'s workflows")


def team_for_new(user: User, team: str | None) -> Team:
    """The team a new workflow or credential joins: ``team`` (a slug) when given, which
    ``user`` must author in; otherwise their only such team, or the default team for a global
    role. Someone authoring in several teams must say which (nothing is guessed)."""
    teams = teams_where(user, Capability.AUTHOR_WORKFLOWS)
    if team:
        chosen = Team.objects.filter(slug=team).first()
        if chosen is None:
            _refuse(f"there is no team '{team}'")
        elif teams is not None and chosen.pk not in teams:
            _refuse(f"you may not make workflows or credentials in {chosen}")
        else:
            return chosen
    if teams is None:
        return Team.objects.get(pk=default_team_id())
    if not teams:
        _refuse("you may make workflows or credentials in no team")
    if len(teams) > 1:
        slugs = Team.objects.filter(pk__in=teams).order_by("slug").values_list("slug", flat=True)
        _refuse(f"say which team: {' or '.join(slugs)}")
    return Team.objects.get(pk=next(iter(teams)))


def _refuse(message: str) -> NoReturn:
    raise WorkflowError(message, {"team": [message]})


def foreign_credentials(team: Team, names: Iterable[str]) -> list[str]:
    """The credentials among ``names`` that ``team``'s workflows may not use, each named as a
    missing one is: another team's credentials are not there for this team ([] for none)."""
    return [
        f"there is no credential named '{name}'"
        for name in Credential.objects.filter(name__in=list(names))
        .exclude(team=team)
        .order_by("name")
        .values_list("name", flat=True)
    ]
