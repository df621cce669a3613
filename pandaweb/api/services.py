"""API tokens: making, revoking and authenticating them; service accounts.

``token_authenticate`` is the one door for every token-authenticated adapter (the HTTP API, the
MCP server): it checks the secret, expiry, revocation and the owner, and returns what the token may
do now, bounded by the owner's role.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth.models import Group, Permission, User
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from pandaweb.api.models import ApiToken, ServiceAccount
from pandaweb.api.scopes import SCOPE_CAPABILITY, Scope
from pandaweb.audit.services import audit_record
from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability, Role

PREFIX = "pw_"
# 32 random bytes: guessing is hopeless, so a fast hash (SHA-256) is the right one to store; a
# slow password hash would only make every request slower.
_SECRET_BYTES = 32
_SHOWN_CHARS = 11  # "pw_" and 8 characters of the secret
# last_used_at is written at most this often per token: a busy token costs no write per request.
LAST_USED_RESOLUTION = timedelta(seconds=60)


class TokenError(Exception):
    def __init__(self, message: str, field_errors: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.field_errors = field_errors or {}


@dataclass(frozen=True)
class TokenContext:
    """An authenticated token: whose it is and what it may do right now."""

    token_id: int
    name: str
    kind: str
    user: User
    scopes: frozenset[Scope]  # as granted on the token
    effective: frozenset[Scope]  # granted and within the owner's role today
    expires_at: datetime | None = None

    def allows(self, scope: Scope) -> bool:
        return scope in self.effective

    @property
    def audit_label(self) -> dict[str, object]:
        return {"channel": "api", "id": self.token_id, "name": self.name, "kind": self.kind}


def hash_secret(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def _role_allows(user: User, scope: Scope) -> bool:
    capability = SCOPE_CAPABILITY[scope]
    return user.is_active if capability is None else user_can(user, capability)


def effective_scopes(user: User, scopes: Iterable[str]) -> frozenset[Scope]:
    granted = {Scope(s) for s in scopes if s in Scope._value2member_map_}
    return frozenset(s for s in granted if _role_allows(user, s))


def _capabilities(user: User) -> frozenset[str]:
    """The owner's capability codenames in one query (``user.has_perm`` takes two: the user's
    own permissions and their groups'). The same answer as ``user_can`` for every capability:
    active users only, superusers hold all, permissions come from the model backend."""
    if not user.is_active:
        return frozenset()
    if user.is_superuser:
        return frozenset(c.value for c in Capability)
    codenames = (
        Permission.objects.filter(content_type__app_label="core")
        .filter(Q(user=user) | Q(group__user=user))
        .values_list("codename", flat=True)
        .distinct()
    )
    return frozenset(codenames)


def token_authenticate(raw: str) -> TokenContext | None:
    """The token whose secret is ``raw``, or None when it is unknown, revoked, expired or its owner
    is inactive (the caller answers all of these alike: 401).

    Costs one query for the token and its owner, one for the owner's permissions, and at most one
    write a minute for ``last_used_at``. Idempotent apart from that timestamp.
    """
    if not raw.startswith(PREFIX) or len(raw) > 200:
        return None
    token = (
        ApiToken.objects.select_related("user")
        .filter(secret_sha256=hash_secret(raw), revoked_at__isnull=True)
        .first()
    )
    now = timezone.now()
    if token is None or not token.user.is_active:
        return None
    if token.expires_at is not None and token.expires_at <= now:
        return None
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
        # Conditional: of two processes seeing the same stale time, one writes.
        ApiToken.objects.filter(pk=token.pk, last_used_at=token.last_used_at).update(
            last_used_at=now
        )
    scopes = frozenset(Scope(s) for s in token.scopes if s in Scope._value2member_map_)
    held = _capabilities(token.user)
    return TokenContext(
        token_id=token.pk,
        name=token.name,
        kind=token.kind,
        user=token.user,
        scopes=scopes,
        effective=frozenset(s for s in scopes if _held(SCOPE_CAPABILITY[s], held)),
        expires_at=token.expires_at,
    )


def _held(capability: Capability | None, held: frozenset[str]) -> bool:
    # Only active owners get this far (token_authenticate), and they hold what needs nothing.
    return capability is None or capability.value in held


def _new_secret() -> str:
    return PREFIX + secrets.token_urlsafe(_SECRET_BYTES)


def may_manage_service_accounts(user: User) -> bool:
    """Admins make service accounts and their tokens, and revoke anyone's tokens."""
    return user.is_superuser or user.groups.filter(name=Role.ADMINS.value).exists()


def token_create(
    *,
    actor: User,
    owner: User,
    name: str,
    scopes: Iterable[str],
    expires_at: datetime | None,
    via: TokenContext | None = None,
) -> tuple[ApiToken, str]:
    """Make a token for ``owner`` and return it with its secret (shown once, stored hashed).

    A person makes personal tokens for themself; only admins make tokens for a service account.
    Scopes beyond the owner's role are refused here (they would grant nothing). Made ``via`` a
    token (the API), it gets no scope that token may not use and expires no later: a token
    never mints a stronger one. Not idempotent.
    """
    name = name.strip()
    errors: dict[str, list[str]] = {}
    if not name:
        errors.setdefault("name", []).append("Give the token a name.")
    wanted = sorted(set(scopes))
    unknown = [s for s in wanted if s not in Scope._value2member_map_]
    if unknown:
        errors.setdefault("scopes", []).append(f"Unknown scopes: {', '.join(unknown)}.")
    elif not wanted:
        errors.setdefault("scopes", []).append("Choose at least one scope.")
    else:
        beyond = [s for s in wanted if not _role_allows(owner, Scope(s))]
        if beyond:
            errors.setdefault("scopes", []).append(
                f"{owner.get_username()}'s role does not allow: {', '.join(beyond)}."
            )
        stronger = [s for s in wanted if via is not None and Scope(s) not in via.effective]
        if stronger:
            errors.setdefault("scopes", []).append(
                f"The token making it may not use: {', '.join(stronger)}; a token never makes "
                "one with more power than its own."
            )
    if expires_at is not None and expires_at <= timezone.now():
        errors.setdefault("expires_at", []).append("The expiry must be in the future.")
    elif (
        via is not None
        and via.expires_at is not None
        and (expires_at is None or expires_at > via.expires_at)
    ):
        errors.setdefault("expires_at", []).append(
            f"The token making it expires at {via.expires_at.isoformat()}; this one must "
            "expire by then too."
        )
    service = ServiceAccount.objects.filter(user=owner).exists()
    if service:
        if not may_manage_service_accounts(actor):
            raise PermissionDenied("only admins make tokens for service accounts")
    elif actor.pk != owner.pk:
        raise PermissionDenied("a personal token is made by its owner")
    if errors:
        raise TokenError("invalid token", errors)
    raw = _new_secret()
    try:
        with transaction.atomic():
            token = ApiToken.objects.create(
                user=owner,
                kind=ApiToken.Kind.SERVICE if service else ApiToken.Kind.PERSONAL,
                name=name,
                prefix=raw[:_SHOWN_CHARS],
                secret_sha256=hash_secret(raw),
                scopes=wanted,
                created_by=actor,
                expires_at=expires_at,
            )
            audit_record(
                action="api_token.created",
                object_type="api_token",
                object_id=token.pk,
                actor=actor,
                after={
                    "owner": owner.get_username(),
                    "name": name,
                    "kind": token.kind,
                    "prefix": token.prefix,
                    "scopes": wanted,
                    "expires_at": expires_at,
                },
            )
    except IntegrityError:
        raise TokenError(
            "invalid token",
            {"name": [f"{owner.get_username()} already has a token named {name!r}."]},
        ) from None
    return token, raw


def token_revoke(*, token_id: int, actor: User) -> ApiToken:
    """Revoke a token at once. Its owner revokes their own; admins revoke any.

    Idempotent: revoking a revoked token changes nothing and writes no event.
    """
    with transaction.atomic():
        token = ApiToken.objects.select_for_update().select_related("user").get(pk=token_id)
        if token.user_id != actor.pk and not may_manage_service_accounts(actor):
            raise PermissionDenied("this is not your token")
        if token.revoked_at is not None:
            return token
        token.revoked_at = timezone.now()
        token.revoked_by = actor
        token.save(update_fields=["revoked_at", "revoked_by"])
        audit_record(
            action="api_token.revoked",
            object_type="api_token",
            object_id=token.pk,
            actor=actor,
            after={"owner": token.user.get_username(), "name": token.name, "prefix": token.prefix},
        )
    return token


def service_account_create(
    *, actor: User, username: str, roles: Iterable[str], description: str = ""
) -> ServiceAccount:
    """A user for a system (no password, no dashboard sign-in) holding ``roles``. Admins only.

    Not idempotent: a taken username is refused.
    """
    if not may_manage_service_accounts(actor):
        raise PermissionDenied("only admins make service accounts")
    username = username.strip()
    wanted = sorted(set(roles))
    errors: dict[str, list[str]] = {}
    if not username:
        errors["username"] = ["Give the account a name."]
    elif User.objects.filter(username__iexact=username).exists():
        errors["username"] = [f"{username!r} is taken."]
    valid = {r.value for r in Role}
    if not wanted or set(wanted) - valid:
        errors["roles"] = ["Choose roles from: " + ", ".join(sorted(valid)) + "."]
    if errors:
        raise TokenError("invalid service account", errors)
    with transaction.atomic():
        user = User(username=username, is_active=True)
        user.set_unusable_password()
        user.save()
        user.groups.set(Group.objects.filter(name__in=wanted))
        account = ServiceAccount.objects.create(
            user=user, description=description, created_by=actor
        )
        audit_record(
            action="service_account.created",
            object_type="user",
            object_id=user.pk,
            actor=actor,
            after={"username": username, "roles": wanted, "description": description},
        )
    return account
