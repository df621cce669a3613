"""Accounts and roles from the identity provider's word, each change with its audit event."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group, User
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from pandaweb.audit.services import audit_record
from pandaweb.core.models import Membership, Team
from pandaweb.core.roles import Role
from pandaweb.core.services import roles_sync
from pandaweb.sso.client import SsoRefused
from pandaweb.sso.config import Memberships, OidcSettings
from pandaweb.sso.models import SsoIdentity
from pandaweb.teams.services import TeamError, membership_grant, membership_revoke, team_create

_USERNAME_MAX = User._meta.get_field("username").max_length or 150


def sso_sign_in(
    *, oidc: OidcSettings, claims: dict[str, Any], groups: list[str], request: HttpRequest
) -> User:
    """The account of the person the provider vouched for, created on first sign-in, with exactly
    the roles their groups map to. The caller then logs the account in.

    Precondition: ``claims`` passed the ID token's checks. Raises SsoRefused (after committing
    the removal of any roles the account held; the caller records the refusal) when the groups
    grant no role, when the account is switched off here, or when the username is taken by an
    account not linked to this identity. Idempotent for the same claims and groups, apart from
    the audit event.
    """
    subject = str(claims["sub"])
    memberships = oidc.memberships(groups)
    refusal: SsoRefused | None = None
    with transaction.atomic():
        identity = (
            SsoIdentity.objects.select_for_update()
            .select_related("user")
            .filter(issuer=oidc.issuer, subject=subject)
            .first()
        )
        if identity is None and memberships.grants_access:
            identity = _identity_create(oidc=oidc, subject=subject, claims=claims)
            created = identity is not None
            if identity is None:
                refusal = SsoRefused("name_taken", _username(oidc, claims))
        else:
            created = False
        if identity is not None:
            user = identity.user
            _memberships_apply(user, memberships)
            if not memberships.grants_access:
                refusal = SsoRefused("no_role", ", ".join(sorted(groups)))
            elif not user.is_active:
                refusal = SsoRefused("disabled")
            else:
                identity.last_signed_in_at = timezone.now()
                identity.save(update_fields=["last_signed_in_at"])
                audit_record(
                    action="auth.sso_signed_in",
                    object_type="user",
                    object_id=user.pk,
                    actor=user,
                    request=request,
                    after={
                        "issuer": oidc.issuer,
                        "subject": subject,
                        "created": created,
                        "groups": sorted(group for group in groups if group in oidc.role_map),
                        "roles": sorted(role.value for role in memberships.roles),
                        "team_roles": sorted(
                            f"{grant.role.value}@{grant.team}" for grant in memberships.team_roles
                        ),
                    },
                )
        elif refusal is None:
            refusal = SsoRefused("no_role", ", ".join(sorted(groups)))
    if refusal is not None:
        raise refusal
    assert identity is not None
    return identity.user


def sso_session_recheck(
    *, oidc: OidcSettings, user: User, claims: dict[str, Any], groups: list[str]
) -> None:
    """Apply the groups of a refreshed ID token to the signed-in ``user``.

    Raises SsoRefused (after committing the change of roles) when the token names another person
    or the groups no longer grant any role: the caller then ends the session. Idempotent.
    """
    memberships = oidc.memberships(groups)
    with transaction.atomic():
        identity = SsoIdentity.objects.select_for_update().filter(user=user).first()
        if identity is None or identity.subject != str(claims.get("sub")):
            raise SsoRefused("ended", "the refreshed ID token names another subject")
        _memberships_apply(user, memberships)
    if not memberships.grants_access:
        raise SsoRefused("no_role", ", ".join(sorted(groups)))


def sso_refusal_record(
    *,
    refusal: SsoRefused,
    request: HttpRequest | None,
    subject: str = "",
    user: User | None = None,
) -> None:
    """The audit event of a refused sign-in, or of a session the provider no longer confirms."""
    with transaction.atomic():
        audit_record(
            action="auth.sso_refused",
            object_type="sso",
            object_id=refusal.code,
            actor=user,
            request=request,
            after={"reason": refusal.message, "detail": refusal.detail[:500], "subject": subject},
        )


def _identity_create(
    *, oidc: OidcSettings, subject: str, claims: dict[str, Any]
) -> SsoIdentity | None:
    """A new account for a first sign-in, or None when its username is already someone's."""
    username = _username(oidc, claims)
    if User.objects.filter(username__iexact=username).exists():
        return None
    user = User(
        username=username,
        email=str(claims.get("email", ""))[:254],
        first_name=str(claims.get("given_name", ""))[:150],
        last_name=str(claims.get("family_name", ""))[:150],
    )
    # Signs in through the provider only: a password here would outlive its removal there.
    user.set_unusable_password()
    user.save()
    return SsoIdentity.objects.create(user=user, issuer=oidc.issuer, subject=subject)


def _username(oidc: OidcSettings, claims: dict[str, Any]) -> str:
    name = claims.get(oidc.username_claim) or claims.get("email") or claims["sub"]
    return str(name)[:_USERNAME_MAX]


def _memberships_apply(user: User, memberships: Memberships) -> None:
    """Give ``user`` exactly the role groups ``memberships`` names (other groups untouched).
    Each change is audited by the membership signal."""
    names = [role.value for role in Role]
    role_groups = {group.name: group for group in Group.objects.filter(name__in=names)}
    if len(role_groups) < len(names):
        roles_sync()
        role_groups = {group.name: group for group in Group.objects.filter(name__in=names)}
    wanted = {role_groups[role.value] for role in memberships.roles}
    held = set(user.groups.filter(name__in=names))
    if held - wanted:
        user.groups.remove(*(held - wanted))
    if wanted - held:
        user.groups.add(*(wanted - held))
    _team_roles_apply(user, memberships)


def _team_made(slug: str) -> Team:
    try:
        return team_create(name=slug.replace("-", " ").title(), slug=slug, user=None)
    except TeamError:
        # Made meanwhile by the sign-in of another person of the same new team.
        return Team.objects.get(slug=slug)


def _team_roles_apply(user: User, memberships: Memberships) -> None:
    """Give ``user`` exactly the team roles ``memberships`` names: the provider is the source of
    truth for a person who signs in through it, so a role granted here by hand does not outlive
    the next sign-in or refresh. A team named by the mapping that does not exist yet is made."""
    wanted: set[tuple[int, str]] = set()
    for grant in memberships.team_roles:
        team = Team.objects.filter(slug=grant.team).first() or _team_made(grant.team)
        wanted.add((team.pk, grant.role.value))
    held = set(Membership.objects.filter(user=user).values_list("team_id", "role"))
    for team_id, role in sorted(held - wanted):
        membership_revoke(team_id=team_id, member=user, role=role, user=None)
    for team_id, role in sorted(wanted - held):
        membership_grant(team_id=team_id, member=user, role=role, user=None)
