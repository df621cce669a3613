"""Teams and memberships: each change in one transaction with its audit event."""

from __future__ import annotations

import re

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils.text import slugify

from pandaweb.audit.services import audit_record
from pandaweb.core.models import Membership, Team
from pandaweb.core.permissions import is_admin

# What the Teams page's form and single sign-on's team mapping accept: a slug is a part of
# every address of the team (/teams/<slug>/, /api/v1/teams/<slug>).
_SLUG = re.compile(r"[-a-zA-Z0-9_]{1,63}")
_NAME_CHARS = 200


class TeamError(Exception):
    """A change to teams refused, in words for the person who asked for it; ``field`` names the
    input at fault (``name``, ``slug``, ``role``) when one is."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class TeamExists(TeamError):
    """The slug is another team's: a conflict with that team rather than a bad input."""


def _refuse_unless_admin(user: User | None) -> None:
    # None is the installation itself: the command line, or single sign-on's group mapping.
    if user is not None and not is_admin(user):
        raise TeamError("only administrators manage teams")


def _role_check(role: str) -> None:
    if role not in Membership.TeamRole.values:
        raise TeamError(
            f"{role!r} is not a team role: choose one of {', '.join(Membership.TeamRole.values)}",
            field="role",
        )


def team_create(*, name: str, slug: str = "", user: User | None) -> Team:
    """Make a team. Not idempotent: a second team with the same slug is refused."""
    _refuse_unless_admin(user)
    name = name.strip()
    if not name:
        raise TeamError("give the team a name", field="name")
    if len(name) > _NAME_CHARS:
        raise TeamError(f"keep the team's name within {_NAME_CHARS} characters", field="name")
    slug = slug.strip() or slugify(name)[:63]
    if not _SLUG.fullmatch(slug):
        raise TeamError(
            "give the team a short name of letters, digits and hyphens (63 at most)", field="slug"
        )
    try:
        with transaction.atomic():
            team = Team.objects.create(name=name, slug=slug)
            audit_record(
                action="team.created", object_type="team", object_id=team.pk, actor=user,
                after={"slug": team.slug, "name": team.name}, team_id=team.pk,
            )  # fmt: skip
    except IntegrityError:
        raise TeamExists(f"a team called {slug!r} already exists", field="slug") from None
    return team


def membership_grant(*, team_id: int, member: User, role: str, user: User | None) -> Membership:
    """Give ``member`` ``role`` in the team. Idempotent: granting a role held changes nothing."""
    _refuse_unless_admin(user)
    _role_check(role)
    with transaction.atomic():
        team = Team.objects.select_for_update().get(pk=team_id)
        membership, created = Membership.objects.get_or_create(team=team, user=member, role=role)
        if created:
            audit_record(
                action="team.member_added", object_type="team", object_id=team.pk, actor=user,
                after={"member": member.get_username(), "role": role}, team_id=team.pk,
            )  # fmt: skip
    return membership


def membership_revoke(*, team_id: int, member: User, role: str, user: User | None) -> bool:
    """Take ``role`` in the team from ``member``; their next request no longer has it.
    Idempotent: returns False when they did not hold it."""
    _refuse_unless_admin(user)
    _role_check(role)
    with transaction.atomic():
        team = Team.objects.select_for_update().get(pk=team_id)
        deleted, _ = Membership.objects.filter(team=team, user=member, role=role).delete()
        if deleted:
            audit_record(
                action="team.member_removed", object_type="team", object_id=team.pk, actor=user,
                before={"member": member.get_username(), "role": role}, team_id=team.pk,
            )  # fmt: skip
    return bool(deleted)
