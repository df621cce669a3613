"""API tokens and service accounts over the API: the token pages' services, with the same rules
(a person's own tokens; admins manage service accounts and their tokens) and audit events.

A token's secret is in one answer only, the one that makes it; lists never carry it. A token makes
no token with a scope it may not use itself, nor one that outlives it (``token_create``'s
``via``), so ``tokens:write`` never turns into more power than the token holds.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest
from django.urls import reverse
from django.utils import timezone
from ninja import Router, Schema, Status
from pydantic import Field

from pandaweb.api import services
from pandaweb.api.access import token_with_scope
from pandaweb.api.models import ApiToken, ServiceAccount
from pandaweb.api.problems import Problem, field_errors
from pandaweb.api.scopes import Scope
from pandaweb.api.services import TokenContext

tokens = Router(tags=["tokens"])
service_accounts = Router(tags=["tokens"])

INVALID = "the request is not valid"


class TokenOut(Schema):
    id: int
    name: str
    kind: str = Field(description="personal, or service (a service account's).")
    owner: str
    prefix: str = Field(description="The secret's first characters: enough to recognise it.")
    scopes: list[str] = Field(description="As granted when it was made.")
    team: str | None = Field(
        description="The one team it is limited to (its slug), or null: all the owner's teams."
    )
    effective_scopes: list[str] = Field(
        description="The granted scopes the owner's role allows today: what it may do."
    )
    created_by: str
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None
    revoked_at: datetime | None
    revoked_by: str | None
    links: dict[str, str]


class TokenCreatedOut(TokenOut):
    secret: str = Field(description="The token (pw_…), shown this once: keep it.")


class TokenIn(Schema):
    name: str
    scopes: list[str] = Field(
        description="Each within the owner's role and held by the token making it."
    )
    expires_at: datetime | None = Field(
        None,
        description="Optional; no later than the token making it expires. A time without a "
        "zone is the server's.",
    )
    team: str | None = Field(
        None,
        description="Limit it to this one of the owner's teams (a slug): it then reaches that "
        "team's workflows, runs and approvals only. A token made with a limited token is "
        "limited to the same team.",
    )


class ServiceAccountOut(Schema):
    id: int
    username: str
    description: str
    roles: list[str]
    created_by: str
    created_at: datetime
    tokens: list[TokenOut]
    links: dict[str, str]


class ServiceAccountIn(Schema):
    username: str
    roles: list[str] = Field(description="Role groups: Operators, Reviewers, Compliance, Admins.")
    description: str = Field("", max_length=500)


def _url(name: str, **kwargs: Any) -> str:
    return reverse(f"api:{name}", kwargs=kwargs)


_TOKEN_RELATED = ("user", "created_by", "revoked_by", "team")


def _token_out(token: ApiToken) -> dict[str, Any]:
    return {
        "id": token.pk,
        "name": token.name,
        "kind": token.kind,
        "owner": token.user.get_username(),
        "prefix": token.prefix,
        "scopes": list(token.scopes),
        "effective_scopes": sorted(
            s.value
            for s in services.effective_scopes(token.user, token.scopes, team_id=token.team_id)
        ),
        "team": token.team.slug if token.team else None,
        "created_by": token.created_by.get_username(),
        "created_at": token.created_at,
        "expires_at": token.expires_at,
        "last_used_at": token.last_used_at,
        "revoked_at": token.revoked_at,
        "revoked_by": token.revoked_by.get_username() if token.revoked_by else None,
        "links": {"revoke": _url("token_revoke", token_id=token.pk)},
    }


def _tokens_of(user: User) -> list[TokenOut]:
    found = ApiToken.objects.filter(user=user).select_related(
        "user", "created_by", "revoked_by", "team"
    )
    return [TokenOut(**_token_out(t)) for t in found.order_by("-created_at", "-pk")]


def _refused(exc: services.TokenError) -> Problem:
    return Problem(422, INVALID, errors=field_errors(exc.field_errors or {"__all__": [str(exc)]}))


def _create(context: TokenContext, owner: User, payload: TokenIn) -> TokenCreatedOut:
    expires_at = payload.expires_at
    if expires_at is not None and timezone.is_naive(expires_at):
        expires_at = timezone.make_aware(expires_at)
    try:
        token, raw = services.token_create(
            actor=context.user,
            owner=owner,
            name=payload.name,
            scopes=payload.scopes,
            expires_at=expires_at,
            via=context,
            team=payload.team,
        )
    except services.TokenError as exc:
        raise _refused(exc) from None
    made = ApiToken.objects.select_related(*_TOKEN_RELATED).get(pk=token.pk)
    return TokenCreatedOut(**_token_out(made), secret=raw)


# The owner's tokens ------------------------------------------------------------------------------


@tokens.get("/", response=list[TokenOut], url_name="token_list", summary="List your tokens")
def token_list(request: HttpRequest) -> list[TokenOut]:
    """The token owner's personal tokens, revoked ones included, newest first; never their
    secrets. Scope: ``tokens:read``."""
    context = token_with_scope(request, Scope.TOKENS_READ)
    return _tokens_of(context.user)


@tokens.post("/", response={201: TokenCreatedOut}, url_name="token_create", summary="Make a token")
def token_create(request: HttpRequest, payload: TokenIn) -> Status[TokenCreatedOut]:
    """A new token of the owner, with its secret in this answer only. Its scopes must be within
    the owner's role and held by this token; it expires no later than this token. (A service
    account's token makes one only if the account is an admin, as only admins make those.)
    Scope: ``tokens:write``."""
    context = token_with_scope(request, Scope.TOKENS_WRITE)
    return Status(201, _create(context, context.user, payload))


@tokens.post(
    "/{int:token_id}/revoke", response=TokenOut, url_name="token_revoke", summary="Revoke a token"
)
def token_revoke(request: HttpRequest, token_id: int) -> TokenOut:
    """Revoke a token at once: one of the owner's, or (admins) anyone's. Idempotent: a revoked
    token is returned as it is. A token may revoke itself. Scope: ``tokens:write``."""
    context = token_with_scope(request, Scope.TOKENS_WRITE)
    token = ApiToken.objects.filter(pk=token_id).first()
    if token is None or (
        token.user_id != context.user.pk and not services.may_manage_service_accounts(context.user)
    ):
        raise Http404("no such token")
    services.token_revoke(token_id=token.pk, actor=context.user)
    revoked = ApiToken.objects.select_related(*_TOKEN_RELATED).get(pk=token.pk)
    return TokenOut(**_token_out(revoked))


# Service accounts (admins) -----------------------------------------------------------------------


def _admin(context: TokenContext) -> None:
    if not services.may_manage_service_accounts(context.user):
        raise PermissionDenied("service accounts are managed by admins")


def _account_out(account: ServiceAccount) -> ServiceAccountOut:
    user = account.user
    return ServiceAccountOut(
        id=account.pk,
        username=user.get_username(),
        description=account.description,
        roles=sorted(g.name for g in user.groups.all()),
        created_by=account.created_by.get_username(),
        created_at=account.created_at,
        tokens=_tokens_of(user),
        links={"tokens": _url("service_account_token_create", account_id=account.pk)},
    )


def _account(account_id: int) -> ServiceAccount:
    account = (
        ServiceAccount.objects.select_related("user", "created_by")
        .prefetch_related("user__groups")
        .filter(pk=account_id)
        .first()
    )
    if account is None:
        raise Http404("no such service account")
    return account


@service_accounts.get(
    "/",
    response=list[ServiceAccountOut],
    url_name="service_account_list",
    summary="List service accounts",
)
def service_account_list(request: HttpRequest) -> list[ServiceAccountOut]:
    """Users for other systems (no password, no dashboard sign-in), with their roles and tokens
    (never the secrets). Admins only. Scope: ``tokens:read``."""
    context = token_with_scope(request, Scope.TOKENS_READ)
    _admin(context)
    accounts = ServiceAccount.objects.select_related("user", "created_by").prefetch_related(
        "user__groups"
    )
    return [_account_out(a) for a in accounts]


@service_accounts.post(
    "/",
    response={201: ServiceAccountOut},
    url_name="service_account_create",
    summary="Make a service account",
)
def service_account_create(
    request: HttpRequest, payload: ServiceAccountIn
) -> Status[ServiceAccountOut]:
    """A user for another system holding the roles given, which bound what its tokens may do;
    it has no password and cannot sign in. Admins only. Scope: ``tokens:write``."""
    context = token_with_scope(request, Scope.TOKENS_WRITE)
    _admin(context)
    try:
        account = services.service_account_create(
            actor=context.user,
            username=payload.username,
            roles=payload.roles,
            description=payload.description,
        )
    except services.TokenError as exc:
        raise _refused(exc) from None
    return Status(201, _account_out(_account(account.pk)))


@service_accounts.post(
    "/{int:account_id}/tokens",
    response={201: TokenCreatedOut},
    url_name="service_account_token_create",
    summary="Make a service account's token",
)
def service_account_token_create(
    request: HttpRequest, account_id: int, payload: TokenIn
) -> Status[TokenCreatedOut]:
    """A token of the service account, with its secret in this answer only. Its scopes must be
    within the account's roles and held by the token making it; it expires no later than that
    token. Revoke it with ``POST /tokens/{id}/revoke``. Admins only. Scope: ``tokens:write``."""
    context = token_with_scope(request, Scope.TOKENS_WRITE)
    _admin(context)
    return Status(201, _create(context, _account(account_id).user, payload))
