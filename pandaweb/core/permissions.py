from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import wraps
from typing import Any, TypeVar

from django.contrib.auth.models import (
    AbstractBaseUser,
    AnonymousUser,
    Permission,
    PermissionsMixin,
    User,
)
from django.core.exceptions import PermissionDenied
from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest, HttpResponseBase

from pandaweb.core.models import Membership, Team
from pandaweb.core.roles import ROLE_CAPABILITIES, Capability, Role

# The team roles that grant each capability in their team (admins are no team role).
TEAM_ROLES_GRANTING: dict[Capability, tuple[str, ...]] = {
    capability: tuple(
        role.value
        for role, granted in ROLE_CAPABILITIES.items()
        if capability in granted and role != Role.ADMINS
    )
    for capability in Capability
}
_CACHE = "_pandaweb_team_access"

M = TypeVar("M", bound=Model)


@dataclass(frozen=True)
class Access:
    """What one person holds: the capabilities they hold in every team (a global role, a
    permission granted to them, superuser) and their team roles as (team id, role)."""

    everywhere: frozenset[Capability]
    team_roles: frozenset[tuple[int, str]]
    # Set for a token limited to one of its owner's teams: it reaches that team only, and holds
    # no installation-wide right (an admin's included).
    team: int | None = None

    def teams_where(self, capability: Capability) -> frozenset[int] | None:
        """The teams where this person holds ``capability``; None means every team."""
        if capability in self.everywhere:
            teams = None
        else:
            granting = TEAM_ROLES_GRANTING[capability]
            teams = frozenset(team for team, role in self.team_roles if role in granting)
        if self.team is None:
            return teams
        return frozenset({self.team}) if teams is None or self.team in teams else frozenset()

    @property
    def anywhere(self) -> frozenset[Capability]:
        """The capabilities held in at least one team."""
        if self.team is not None:
            return frozenset(c for c in Capability if self.teams_where(c))
        in_teams = {c for _, role in self.team_roles for c in ROLE_CAPABILITIES[Role(role)]}
        return self.everywhere | in_teams

    def limited_to(self, team_id: int) -> Access:
        return replace(self, team=team_id)


NO_ACCESS = Access(everywhere=frozenset(), team_roles=frozenset())


def access_of(users: Iterable[User]) -> dict[int, Access]:
    """``Access`` of many people at once, in three queries whatever their number (global
    permissions through groups, their own, team memberships): the one reading of roles that
    ``teams_where`` and the token checks share. Inactive people hold nothing."""
    people = {user.pk: user for user in users}
    everywhere: dict[int, set[Capability]] = {pk: set() for pk in people}
    roles: dict[int, set[tuple[int, str]]] = {pk: set() for pk in people}
    if people:
        core = Permission.objects.filter(
            content_type__app_label="core", codename__in=[c.value for c in Capability]
        )
        granted = [
            *core.filter(group__user__in=people).values_list("group__user", "codename"),
            *core.filter(user__in=people).values_list("user", "codename"),
        ]
        for pk, codename in granted:
            everywhere[pk].add(Capability(codename))
        memberships = Membership.objects.filter(user_id__in=people)
        for pk, team_id, role in memberships.values_list("user_id", "team_id", "role"):
            roles[pk].add((team_id, role))
    return {
        pk: NO_ACCESS
        if not user.is_active
        else Access(
            everywhere=frozenset(Capability) if user.is_superuser else frozenset(everywhere[pk]),
            team_roles=frozenset(roles[pk]),
        )
        for pk, user in people.items()
    }


def access(user: AbstractBaseUser | AnonymousUser) -> Access:
    """``user``'s ``Access``, read once per user object and kept on it: a request, a websocket
    message or a stream's token check each load the user afresh, so a role removed takes effect
    at the next one."""
    if not isinstance(user, User) or not (user.is_authenticated and user.is_active):
        return NO_ACCESS
    cached: Access | None = user.__dict__.get(_CACHE)
    if cached is None:
        cached = user.__dict__[_CACHE] = access_of([user])[user.pk]
    return cached


def access_remember(user: User, held: Access) -> None:
    """Make ``held`` what ``user`` (this object) holds: the request of a token limited to one
    team reaches that team only, through every check that asks ``teams_where``."""
    user.__dict__[_CACHE] = held


def teams_where(
    user: AbstractBaseUser | AnonymousUser, capability: Capability
) -> frozenset[int] | None:
    """The ids of the teams in which ``user`` holds ``capability``; None means every team (a
    global role: admins, compliance given every team, a permission granted to the person)."""
    return access(user).teams_where(capability)


def sees_several_teams(user: AbstractBaseUser | AnonymousUser, capability: Capability) -> bool:
    """Whether what ``user`` lists under ``capability`` mixes teams (so a list names each row's
    team)."""
    teams = teams_where(user, capability)
    return len(teams) > 1 if teams is not None else Team.objects.count() > 1


def is_admin(user: AbstractBaseUser | AnonymousUser) -> bool:
    """Admins hold the whole installation: every team, people, teams and service accounts."""
    if not isinstance(user, PermissionsMixin) or not (user.is_authenticated and user.is_active):
        return False
    held: Access | None = user.__dict__.get(_CACHE)
    if held is not None and held.team is not None:
        return False
    return user.is_superuser or user.groups.filter(name=Role.ADMINS.value).exists()


def user_can(
    user: AbstractBaseUser | AnonymousUser, capability: Capability, *, team_id: int | None = None
) -> bool:
    """Whether ``user`` holds ``capability`` in the team ``team_id``, or (without it) in any team:
    what a page listing several teams' objects asks before listing them."""
    teams = teams_where(user, capability)
    if teams is None:
        return True
    return team_id in teams if team_id is not None else bool(teams)


def in_teams(
    objects: QuerySet[M], user: AbstractBaseUser | AnonymousUser, capability: Capability,
    *, via: str = "team",
) -> QuerySet[M]:  # fmt: skip
    """``objects`` narrowed to the teams where ``user`` holds ``capability``; ``via`` is the path
    from the model to its team (``run__team`` for an approval)."""
    teams = teams_where(user, capability)
    return objects if teams is None else objects.filter(**{f"{via}__in": teams})


def people_with(capability: Capability, *, team_id: int | None) -> QuerySet[User]:
    """The active people who hold ``capability`` in the team ``team_id``: ``teams_where``'s rule
    as one query (whom to tell of a run's approval, whose verdicts count toward its quorum)."""
    granted = {
        "content_type__app_label": "core",
        "codename": capability.value,
    }
    through_groups = User.objects.filter(
        **{f"groups__permissions__{k}": v for k, v in granted.items()}
    ).values("pk")
    through_user = User.objects.filter(
        **{f"user_permissions__{k}": v for k, v in granted.items()}
    ).values("pk")
    members = Membership.objects.filter(
        Q(team_id=team_id), role__in=TEAM_ROLES_GRANTING[capability]
    ).values("user_id")
    return User.objects.filter(is_active=True).filter(
        Q(is_superuser=True) | Q(pk__in=through_groups) | Q(pk__in=through_user) | Q(pk__in=members)
    )


def capability_required(
    capability: Capability,
) -> Callable[[Callable[..., HttpResponseBase]], Callable[..., HttpResponseBase]]:
    """Refuse a signed-in user without ``capability`` with 403.

    Anonymous users never get here: ``LoginRequiredMiddleware`` sends them to the login page.
    """

    def decorator(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not user_can(request.user, capability):
                raise PermissionDenied(f"This page needs the capability '{capability.value}'.")
            return view(request, *args, **kwargs)

        return wrapped

    return decorator
