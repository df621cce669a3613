from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, PermissionsMixin, User
from django.core.exceptions import PermissionDenied
from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest, HttpResponseBase

from pandaweb.core.models import Membership
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


def teams_where(
    user: AbstractBaseUser | AnonymousUser, capability: Capability
) -> frozenset[int] | None:
    """The ids of the teams in which ``user`` holds ``capability``; None means every team (a
    global role: admins, compliance given every team, a permission granted to the person).

    One query per capability per user object, kept on it: a request, a websocket message or a
    stream's token check each load the user afresh, so a membership removed takes effect at the
    next one.
    """
    if not isinstance(user, PermissionsMixin) or not (user.is_authenticated and user.is_active):
        return frozenset()
    if user.has_perm(capability.perm):
        return None
    cache: dict[Capability, frozenset[int]] = user.__dict__.setdefault(_CACHE, {})
    if capability not in cache:
        cache[capability] = frozenset(
            Membership.objects.filter(
                user_id=user.pk, role__in=TEAM_ROLES_GRANTING[capability]
            ).values_list("team_id", flat=True)
        )
    return cache[capability]


def is_admin(user: AbstractBaseUser | AnonymousUser) -> bool:
    """Admins hold the whole installation: every team, people, teams and service accounts."""
    if not isinstance(user, PermissionsMixin) or not (user.is_authenticated and user.is_active):
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
