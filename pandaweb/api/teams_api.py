"""Teams and who holds which role in them, over the API: the Teams pages' selectors and services,
with their rules and audit events (``team.created``, ``team.member_added``,
``team.member_removed``).

Everyone reads the teams they belong to and their own roles there; a team's people (who, and how
many) and its workflow count are shown to admins only, as on the pages. Making teams and changing
roles is the admins'. A token limited to one team holds no admin's right (``is_admin``) and sees
that team alone.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from django.urls import reverse
from ninja import Router, Schema, Status
from pydantic import Field

from pandaweb.api.access import token_with_scope
from pandaweb.api.problems import Problem
from pandaweb.api.scopes import Scope
from pandaweb.api.services import TokenContext
from pandaweb.core.models import Membership, Team
from pandaweb.core.permissions import is_admin
from pandaweb.teams import selectors, services
from pandaweb.teams.selectors import TeamRow

router = Router(tags=["teams"])

INVALID = "the request is not valid"
ROLES = ", ".join(Membership.TeamRole.values)


class MemberOut(Schema):
    username: str
    roles: list[str] = Field(description=f"The roles held in the team: {ROLES}.")


class TeamOut(Schema):
    slug: str
    name: str
    my_roles: list[str] = Field(
        description=f"The token owner's roles in the team ({ROLES}); empty for an admin who "
        "holds none there."
    )
    people: int | None = Field(description="How many people hold a role there; admins only.")
    workflows: int | None = Field(description="How many workflows it has; admins only.")
    created_at: datetime
    links: dict[str, str]


class TeamDetailOut(TeamOut):
    members: list[MemberOut] | None = Field(
        description="Who holds which role, by username; admins only (null for others), as the "
        "team's page is theirs."
    )


class TeamIn(Schema):
    name: str = Field(description="What people call it, e.g. “Accounts payable”.")
    slug: str = Field(
        "",
        description="Its short name in addresses: letters, digits, hyphens (63 at most); "
        "made from the name when left out.",
    )


class MemberIn(Schema):
    username: str
    role: str = Field(description=f"One of {ROLES} (as ``manage.py team`` names them).")


def _url(name: str, **kwargs: Any) -> str:
    return reverse(f"api:{name}", kwargs=kwargs)


def _team_out(row: TeamRow, *, admin: bool) -> dict[str, Any]:
    team = row.team
    return {
        "slug": team.slug,
        "name": team.name,
        "my_roles": row.roles,
        "people": team.people if admin else None,  # type: ignore[attr-defined]
        "workflows": team.workflow_count if admin else None,  # type: ignore[attr-defined]
        "created_at": team.created_at,
        "links": {
            "self": _url("team_get", slug=team.slug),
            "add_member": _url("team_member_add", slug=team.slug),
        },
    }


def _detail(context: TokenContext, slug: str) -> TeamDetailOut:
    row = selectors.team_seen(context.user, slug)
    admin = is_admin(context.user)
    members: list[MemberOut] | None = None
    if admin:
        roles: dict[str, list[str]] = {}
        for membership in selectors.team_members(row.team):
            roles.setdefault(membership.user.get_username(), []).append(membership.role)
        members = [MemberOut(username=name, roles=held) for name, held in roles.items()]
    return TeamDetailOut(**_team_out(row, admin=admin), members=members)


def _admin(context: TokenContext) -> None:
    """Refused before anything is looked up, so a refusal says nothing of which teams exist."""
    if is_admin(context.user):
        return
    if context.access.team is not None:
        raise Problem(
            403,
            "a token limited to one team manages no teams: teams and their members are managed "
            "by admins",
        )
    raise Problem(403, "teams and their members are managed by admins")


def _refused(exc: services.TeamError) -> Problem:
    errors = [{"field": exc.field, "message": str(exc)}] if exc.field else []
    if isinstance(exc, services.TeamExists):
        return Problem(409, str(exc), type="team-exists", errors=errors)
    if exc.field:
        return Problem(422, INVALID, errors=errors)
    return Problem(403, str(exc))


def _member(username: str) -> User:
    """An active person by username (any case), as the team page's form finds them."""
    username = username.strip()
    member = User.objects.filter(username__iexact=username, is_active=True).first()
    if member is None:
        message = f"nobody here is called {username!r}" if username else "say whose role it is"
        raise Problem(422, INVALID, errors=[{"field": "username", "message": message}])
    return member


@router.get("/", response=list[TeamOut], url_name="team_list", summary="List your teams")
def team_list(request: HttpRequest) -> list[TeamOut]:
    """The teams the token's owner belongs to, by name, with their roles there; every team for
    an admin, with its people and workflow counts. A token limited to one team lists that team
    alone. Scope: ``teams:read``."""
    context = token_with_scope(request, Scope.TEAMS_READ)
    admin = is_admin(context.user)
    return [TeamOut(**_team_out(row, admin=admin)) for row in selectors.teams_listed(context.user)]


@router.get("/{slug}", response=TeamDetailOut, url_name="team_get", summary="Get a team")
def team_get(request: HttpRequest, slug: str) -> TeamDetailOut:
    """One of the teams ``GET /teams/`` lists, with (admins) who holds which role there. Any
    other team is a 404, as a slug no team has. Scope: ``teams:read``."""
    context = token_with_scope(request, Scope.TEAMS_READ)
    return _detail(context, slug)


@router.post("/", response={201: TeamDetailOut}, url_name="team_create", summary="Make a team")
def team_create(request: HttpRequest, payload: TeamIn) -> Status[TeamDetailOut]:
    """A new team, with nobody in it yet. A slug another team has is a 409; a missing name or a
    slug that is not letters, digits and hyphens a 422. Admins only. Scope: ``teams:write``."""
    context = token_with_scope(request, Scope.TEAMS_WRITE)
    _admin(context)
    try:
        team = services.team_create(name=payload.name, slug=payload.slug, user=context.user)
    except services.TeamError as exc:
        raise _refused(exc) from None
    return Status(201, _detail(context, team.slug))


@router.post(
    "/{slug}/members",
    response=TeamDetailOut,
    url_name="team_member_add",
    summary="Give a person a role in a team",
)
def team_member_add(request: HttpRequest, slug: str, payload: MemberIn) -> TeamDetailOut:
    """Give the person ``role`` in the team; they have it at their next request. Idempotent: a
    role held already changes nothing. Answers the team with its members. Admins only.
    Scope: ``teams:write``."""
    context = token_with_scope(request, Scope.TEAMS_WRITE)
    _admin(context)
    team = get_object_or_404(Team, slug=slug)
    member = _member(payload.username)
    try:
        services.membership_grant(
            team_id=team.pk, member=member, role=payload.role, user=context.user
        )
    except services.TeamError as exc:
        raise _refused(exc) from None
    return _detail(context, team.slug)


@router.delete(
    "/{slug}/members/{username}/{role}",
    response=TeamDetailOut,
    url_name="team_member_remove",
    summary="Take a person's role in a team",
)
def team_member_remove(request: HttpRequest, slug: str, username: str, role: str) -> TeamDetailOut:
    """Take ``role`` in the team from the person; their next request no longer has it.
    Idempotent: a role they do not hold changes nothing. Answers the team with its members.
    Admins only. Scope: ``teams:write``."""
    context = token_with_scope(request, Scope.TEAMS_WRITE)
    _admin(context)
    team = get_object_or_404(Team, slug=slug)
    member = _member(username)
    try:
        services.membership_revoke(team_id=team.pk, member=member, role=role, user=context.user)
    except services.TeamError as exc:
        raise _refused(exc) from None
    return _detail(context, team.slug)
