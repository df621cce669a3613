"""API tokens and OAuth clients: making, revoking and authenticating them; service accounts.

``token_authenticate`` is the one door for every token-authenticated adapter (the HTTP API, the
event stream, the MCP server): it takes either kind of bearer token (an API token, or an access
token an OAuth client got at ``/oauth/token/``), checks the secret, expiry, revocation and the
owner, and returns what the token may do now, bounded by the owner's role.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import Group, User
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone
from oauth2_provider.generators import generate_client_secret
from oauth2_provider.models import get_access_token_model, get_application_model

from pandaweb.api.models import ApiToken, OAuthClient, ServiceAccount
from pandaweb.api.scopes import SCOPE_CAPABILITY, Scope
from pandaweb.audit.services import audit_record
from pandaweb.core.models import Team
from pandaweb.core.permissions import Access, access_of, access_remember, is_admin, user_can
from pandaweb.core.roles import Capability, Role

PREFIX = "pw_"
# Access tokens of OAuth clients (pandaweb/api/oauth.py makes them).
OAUTH_PREFIX = "pwo_"
_MAX_BEARER_CHARS = 200
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
    # Whom rate limits count and MCP sessions belong to: the API token, or the OAuth client
    # (whose access tokens are replaced every few minutes).
    principal: str
    # The owner's roles as read with the token: which teams' objects it reaches.
    access: Access
    client_id: str = ""  # an OAuth client's; empty for an API token
    expires_at: datetime | None = None

    def allows(self, scope: Scope) -> bool:
        return scope in self.effective

    @property
    def audit_label(self) -> dict[str, object]:
        label: dict[str, object] = {
            "channel": "api",
            "id": self.token_id,
            "name": self.name,
            "kind": self.kind,
        }
        if self.client_id:
            label["client_id"] = self.client_id
        return label


def hash_secret(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def _role_allows(user: User, scope: Scope, team_id: int | None = None) -> bool:
    capability = SCOPE_CAPABILITY[scope]
    return user.is_active if capability is None else user_can(user, capability, team_id=team_id)


def effective_scopes(
    user: User, scopes: Iterable[str], *, team_id: int | None = None
) -> frozenset[Scope]:
    """The ``scopes`` ``user``'s roles allow today: in any team, or in the team ``team_id``
    (a token limited to it)."""
    granted = {Scope(s) for s in scopes if s in Scope._value2member_map_}
    return frozenset(s for s in granted if _role_allows(user, s, team_id))


def token_authenticate(raw: str) -> TokenContext | None:
    """The bearer token ``raw`` (an API token or an OAuth access token), or None when it is
    unknown, revoked, expired or its owner is inactive (the caller answers all of these with 401,
    in the words of ``token_refusal``).

    Costs one query for the token and its owner, one for the owner's permissions, and for an API
    token at most one write a minute for ``last_used_at``. Idempotent apart from that timestamp.
    """
    return tokens_authenticate([raw])[raw]


def tokens_authenticate(raws: Iterable[str]) -> dict[str, TokenContext | None]:
    """``token_authenticate`` for many tokens at once (a server re-checks every open event
    stream's each second): the same answer for each, for one query for all the API tokens and
    their owners, one per owner for their permissions, and one or two per OAuth access token.
    Idempotent apart from ``last_used_at``."""
    found: dict[str, TokenContext | None] = dict.fromkeys(raws)
    usable = [raw for raw in found if len(raw) <= _MAX_BEARER_CHARS]
    found.update(_api_tokens_authenticate([raw for raw in usable if raw.startswith(PREFIX)]))
    for raw in usable:
        if raw.startswith(OAUTH_PREFIX):
            found[raw] = _access_token_authenticate(raw)
    return found


def _context(
    *,
    token_id: int,
    name: str,
    kind: str,
    user: User,
    access: Access,
    granted: Iterable[str],
    principal: str,
    client_id: str = "",
    expires_at: datetime | None = None,
) -> TokenContext:
    """What a token may do now: its grant, narrowed to the capabilities the owner holds today
    in any team (``access``); which team's objects it reaches is decided per object, as for
    its owner on the dashboard."""
    scopes = frozenset(Scope(s) for s in granted if s in Scope._value2member_map_)
    return TokenContext(
        token_id=token_id,
        name=name,
        kind=kind,
        user=user,
        scopes=scopes,
        effective=frozenset(s for s in scopes if _held(SCOPE_CAPABILITY[s], access.anywhere)),
        principal=principal,
        access=access,
        client_id=client_id,
        expires_at=expires_at,
    )


def _api_tokens_authenticate(raws: list[str]) -> dict[str, TokenContext]:
    """The API tokens of ``raws`` that work, by their secret; the others are left out."""
    if not raws:
        return {}
    by_hash = {hash_secret(raw): raw for raw in raws}
    tokens = ApiToken.objects.select_related("user").filter(
        secret_sha256__in=by_hash, revoked_at__isnull=True
    )
    now = timezone.now()
    owners = access_of({token.user for token in tokens})
    found: dict[str, TokenContext] = {}
    for token in tokens:
        if not token.user.is_active:
            continue
        if token.expires_at is not None and token.expires_at <= now:
            continue
        if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
            # Conditional: of two processes seeing the same stale time, one writes.
            ApiToken.objects.filter(pk=token.pk, last_used_at=token.last_used_at).update(
                last_used_at=now
            )
        found[by_hash[token.secret_sha256]] = _context(
            token_id=token.pk,
            name=token.name,
            kind=token.kind,
            user=token.user,
            access=_token_access(token, owners[token.user_id]),
            granted=token.scopes,
            principal=f"token:{token.pk}",
            expires_at=token.expires_at,
        )
    return found


def _token_access(token: ApiToken, owner: Access) -> Access:
    """What the token reaches: its owner's teams, or the one it is limited to; kept on the
    token's user object so that every check of the request asks the same."""
    held = owner if token.team_id is None else owner.limited_to(token.team_id)
    access_remember(token.user, held)
    return held


def _held(capability: Capability | None, held: frozenset[Capability]) -> bool:
    # Only active owners get this far (token_authenticate), and they hold what needs nothing.
    return capability is None or capability in held


def _access_token_find(raw: str) -> Any:
    """The stored access token whose secret is ``raw`` (only its SHA-256 is kept), with its
    client and owner, or None."""
    return (
        get_access_token_model()
        .objects.select_related("application__user", "application__pandaweb_client")
        .filter(token_checksum=hash_secret(raw))
        .first()
    )


def _access_token_authenticate(raw: str) -> TokenContext | None:
    access = _access_token_find(raw)
    if access is None or access.is_expired():
        return None
    application = access.application
    client: OAuthClient | None = getattr(application, "pandaweb_client", None)
    if client is None or client.is_revoked or not application.user.is_active:
        return None
    return _context(
        token_id=access.pk,
        name=application.name,
        kind="oauth",
        user=application.user,
        access=access_of([application.user])[application.user.pk],
        granted=access.scope.split(),
        principal=f"oauth-client:{client.pk}",
        client_id=application.client_id,
        expires_at=access.expires,
    )


BEARER_NEEDED = (
    "a valid API token is needed: Authorization: Bearer pw_… (an API token) or "
    "Bearer pwo_… (an access token from /oauth/token/)"
)


def token_refusal(raw: str) -> str:
    """Why ``token_authenticate`` refused ``raw``, in words for the 401 problem. An OAuth
    client's access token is told apart (expired: ask for a new one; client revoked); an API
    token is not, as before: whoever holds a guessed or stolen one learns nothing. Read-only."""
    if not raw.startswith(OAUTH_PREFIX) or len(raw) > _MAX_BEARER_CHARS:
        return BEARER_NEEDED
    access = _access_token_find(raw)
    if access is None:
        return (
            "this access token is unknown (expired ones are forgotten); "
            "ask /oauth/token/ for a new one"
        )
    client: OAuthClient | None = getattr(access.application, "pandaweb_client", None)
    if client is None or client.is_revoked:
        return "this access token's OAuth client was revoked"
    if not access.application.user.is_active:
        return "this access token's owner is deactivated"
    if access.is_expired():
        return (
            f"this access token expired at {access.expires.isoformat(timespec='seconds')}; "
            "ask /oauth/token/ for a new one"
        )
    return BEARER_NEEDED


def _new_secret() -> str:
    return PREFIX + secrets.token_urlsafe(_SECRET_BYTES)


def may_manage_service_accounts(user: User) -> bool:
    """Admins make service accounts and their tokens, and revoke anyone's tokens."""
    return is_admin(user)


def _check_scopes(
    owner: User, wanted: list[str], errors: dict[str, list[str]], via: TokenContext | None = None
) -> None:
    """Known scopes, at least one, none beyond the owner's role (it would grant nothing), and
    none the token making it (``via``) may not use."""
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


def token_create(
    *,
    actor: User,
    owner: User,
    name: str,
    scopes: Iterable[str],
    expires_at: datetime | None,
    via: TokenContext | None = None,
    team: str | None = None,
) -> tuple[ApiToken, str]:
    """Make a token for ``owner`` and return it with its secret (shown once, stored hashed).

    A person makes personal tokens for themself; only admins make tokens for a service account.
    Scopes beyond the owner's role are refused here (they would grant nothing). ``team`` (a
    slug) limits it to that one of the owner's teams. Made ``via`` a token (the API), it gets no
    scope that token may not use, expires no later and is limited to the same team: a token
    never mints a stronger one. Not idempotent.
    """
    name = name.strip()
    errors: dict[str, list[str]] = {}
    if not name:
        errors.setdefault("name", []).append("Give the token a name.")
    wanted = sorted(set(scopes))
    _check_scopes(owner, wanted, errors, via=via)
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
    team_id = _token_team(owner, team, via, errors)
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
                team_id=team_id,
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
                    "team": team or None,
                },
                team_id=team_id,
            )
    except IntegrityError:
        raise TokenError(
            "invalid token",
            {"name": [f"{owner.get_username()} already has a token named {name!r}."]},
        ) from None
    return token, raw


def _token_teams(owner: User) -> QuerySet[Team]:
    """The teams a token of ``owner`` may be limited to: those where they hold a role; every
    team for a role held in all of them."""
    held = access_of([owner])[owner.pk]
    teams = Team.objects.order_by("name")
    if not held.everywhere:
        teams = teams.filter(pk__in={team for team, _ in held.team_roles})
    return teams


def token_team_choices(owner: User) -> list[tuple[str, str]]:
    """The teams (slug, name) a token of ``owner`` may be limited to (``_token_teams``)."""
    return list(_token_teams(owner).values_list("slug", "name"))


def _token_team(
    owner: User, team: str | None, via: TokenContext | None, errors: dict[str, list[str]]
) -> int | None:
    """The id of the team the new token is limited to (None: all the owner's teams)."""
    limited = via.access.team if via is not None else None
    if not team:
        return limited
    found = _token_teams(owner).filter(slug=team).values_list("pk", flat=True).first()
    if found is None:
        errors.setdefault("team", []).append(
            f"{owner.get_username()} is in no team called {team!r}."
        )
        return None
    if limited is not None and found != limited:
        errors.setdefault("team", []).append(
            "The token making it is limited to another team; this one must be limited to it too."
        )
        return None
    return found


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


def oauth_client_create(
    *, actor: User, owner: User, name: str, scopes: Iterable[str]
) -> tuple[OAuthClient, str]:
    """Make an OAuth client (client credentials grant) acting as ``owner`` and return it with its
    secret (shown once, stored hashed by django-oauth-toolkit). Admins only; the owner is a
    service account or a person, whose role bounds the scopes as for an API token.

    Not idempotent: each call makes a new client id and secret.
    """
    if not may_manage_service_accounts(actor):
        raise PermissionDenied("only admins make OAuth clients")
    name = name.strip()
    errors: dict[str, list[str]] = {}
    if not name:
        errors.setdefault("name", []).append("Give the client a name.")
    elif OAuthClient.objects.filter(
        application__user=owner, application__name=name, revoked_at__isnull=True
    ).exists():
        errors.setdefault("name", []).append(
            f"{owner.get_username()} already has a client named {name!r}."
        )
    if not owner.is_active:
        errors.setdefault("owner", []).append(f"{owner.get_username()} is deactivated.")
    wanted = sorted(set(scopes))
    _check_scopes(owner, wanted, errors)
    if errors:
        raise TokenError("invalid OAuth client", errors)
    secret = generate_client_secret()
    Application = get_application_model()
    with transaction.atomic():
        application = Application.objects.create(
            name=name,
            user=owner,
            client_type=Application.CLIENT_CONFIDENTIAL,
            authorization_grant_type=Application.GRANT_CLIENT_CREDENTIALS,
            client_secret=secret,
            hash_client_secret=True,
        )
        client = OAuthClient.objects.create(
            application=application, scopes=wanted, created_by=actor
        )
        audit_record(
            action="oauth_client.created",
            object_type="oauth_client",
            object_id=client.pk,
            actor=actor,
            after={
                "owner": owner.get_username(),
                "name": name,
                "client_id": application.client_id,
                "scopes": wanted,
            },
        )
    return client, secret


def oauth_client_revoke(*, client_pk: int, actor: User) -> OAuthClient:
    """Revoke an OAuth client at once: it gets no more access tokens, and the ones it holds stop
    working on their next request. Admins only.

    Idempotent: revoking a revoked client changes nothing and writes no event.
    """
    if not may_manage_service_accounts(actor):
        raise PermissionDenied("only admins revoke OAuth clients")
    with transaction.atomic():
        client = (
            # Only the client row: the library's application has a nullable owner (an outer
            # join), which PostgreSQL will not lock.
            OAuthClient.objects.select_for_update(of=("self",))
            .select_related("application__user")
            .get(pk=client_pk)
        )
        if client.revoked_at is not None:
            return client
        client.revoked_at = timezone.now()
        client.revoked_by = actor
        client.save(update_fields=["revoked_at", "revoked_by"])
        audit_record(
            action="oauth_client.revoked",
            object_type="oauth_client",
            object_id=client.pk,
            actor=actor,
            after={
                "owner": client.application.user.get_username(),
                "name": client.application.name,
                "client_id": client.application.client_id,
            },
        )
    return client


def oauth_client_refusal(client: OAuthClient, *, secret_matched: bool) -> str:
    """Why ``client`` gets no access token, or "" when it may have one. Read-only."""
    if not secret_matched:
        return "wrong client secret"
    if client.is_revoked:
        return "the client is revoked"
    if not client.application.user.is_active:
        return "the client's owner is deactivated"
    return ""


def oauth_client_authentication_failed(*, client: OAuthClient, reason: str) -> None:
    """Record a refused token request of a known client, as a failed sign-in is recorded: a wrong
    secret may be a leaked client id being tried. (Issued tokens are not recorded one by one:
    a client asks every few minutes, and every change it makes names its token anyway.)

    Not idempotent: each call appends an event.
    """
    with transaction.atomic():
        audit_record(
            action="oauth_client.authentication_failed",
            object_type="oauth_client",
            object_id=client.pk,
            after={
                "client_id": client.application.client_id,
                "name": client.application.name,
                "reason": reason,
            },
        )


def oauth_tokens_forget_expired(*, application: Any) -> None:
    """Delete ``application``'s expired access tokens (they can do nothing). Idempotent."""
    get_access_token_model().objects.filter(
        application=application, expires__lte=timezone.now()
    ).delete()
