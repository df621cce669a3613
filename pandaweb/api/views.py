"""The dashboard's token pages: a person's own tokens; service accounts, their tokens and their
OAuth clients (admins)."""

from __future__ import annotations

from datetime import datetime, time
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db.models import Max
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from pandaweb.api import services
from pandaweb.api.models import ApiToken, OAuthClient, ServiceAccount
from pandaweb.api.scopes import SCOPE_LABELS, Scope
from pandaweb.core.http import AuthenticatedRequest
from pandaweb.core.permissions import is_admin
from pandaweb.core.roles import Role


def _expiry(text: str) -> datetime | None:
    """A date from the form: the token expires at the end of that day (site time zone)."""
    if not text:
        return None
    day = datetime.fromisoformat(text).date()
    return timezone.make_aware(datetime.combine(day, time.max))


def _scope_choices(owner: User) -> list[dict[str, Any]]:
    allowed = services.effective_scopes(owner, [s.value for s in Scope])
    return [{"value": s.value, "label": SCOPE_LABELS[s], "allowed": s in allowed} for s in Scope]


def _create(request: AuthenticatedRequest, owner: User) -> tuple[str, dict[str, list[str]]]:
    try:
        expires_at = _expiry(request.POST.get("expires", ""))
    except ValueError:
        return "", {"expires_at": ["Give a date like 2027-01-31."]}
    try:
        token, raw = services.token_create(
            actor=request.user,
            owner=owner,
            name=request.POST.get("name", ""),
            scopes=request.POST.getlist("scopes"),
            expires_at=expires_at,
            team=request.POST.get("team") or None,
        )
    except services.TokenError as exc:
        return "", exc.field_errors
    messages.success(request, f"Token “{token.name}” made. Copy it now: it is not shown again.")
    return raw, {}


def _create_oauth_client(
    request: AuthenticatedRequest, owner: User
) -> tuple[dict[str, str], dict[str, list[str]]]:
    try:
        client, secret = services.oauth_client_create(
            actor=request.user,
            owner=owner,
            name=request.POST.get("name", ""),
            scopes=request.POST.getlist("scopes"),
        )
    except services.TokenError as exc:
        return {}, exc.field_errors
    messages.success(
        request, f"OAuth client “{client.application.name}” made. Copy its secret now."
    )
    return {"client_id": client.application.client_id, "secret": secret}, {}


@require_http_methods(["GET", "POST"])
def token_index(request: AuthenticatedRequest) -> HttpResponse:
    """Your personal tokens; a new one's secret is shown once, on the answer to its POST."""
    raw: str = ""
    errors: dict[str, list[str]] = {}
    if request.method == "POST":
        raw, errors = _create(request, request.user)
    context = {
        "owner": request.user,
        "tokens": ApiToken.objects.filter(user=request.user)
        .select_related("team")
        .order_by("-created_at"),
        "scopes": _scope_choices(request.user),
        "teams": services.token_team_choices(request.user),
        "new_secret": raw,
        "errors": errors,
        "form": request.POST if errors else {},
        "now": timezone.now(),
    }
    return render(request, "api/tokens.html", context, status=422 if errors else 200)


@require_POST
def token_revoke(request: AuthenticatedRequest, token_id: int) -> HttpResponse:
    token = ApiToken.objects.filter(pk=token_id).first()
    if token is None or (token.user_id != request.user.pk and not is_admin(request.user)):
        raise Http404("no such token")
    services.token_revoke(token_id=token.pk, actor=request.user)
    messages.success(request, f"Token “{token.name}” revoked.")
    if token.kind == ApiToken.Kind.SERVICE:
        return redirect("account:service_accounts")
    return redirect("account:tokens")


@require_POST
def oauth_client_revoke(request: AuthenticatedRequest, client_pk: int) -> HttpResponse:
    if not is_admin(request.user):
        raise Http404("no such OAuth client")
    client = OAuthClient.objects.select_related("application").filter(pk=client_pk).first()
    if client is None:
        raise Http404("no such OAuth client")
    services.oauth_client_revoke(client_pk=client.pk, actor=request.user)
    messages.success(request, f"OAuth client “{client.application.name}” revoked.")
    return redirect("account:service_accounts")


@require_http_methods(["GET", "POST"])
def service_account_index(request: AuthenticatedRequest) -> HttpResponse:
    """Admins: service accounts (users for other systems) and their tokens."""
    if not is_admin(request.user):
        raise PermissionDenied("service accounts are managed by admins")
    raw: str = ""
    new_client: dict[str, str] = {}
    errors: dict[str, list[str]] = {}
    if request.method == "POST" and request.POST.get("form") == "account":
        try:
            services.service_account_create(
                actor=request.user,
                username=request.POST.get("username", ""),
                roles=request.POST.getlist("roles"),
                description=request.POST.get("description", ""),
            )
            messages.success(request, "Service account made; now give it a token.")
            return redirect("account:service_accounts")
        except services.TokenError as exc:
            errors = exc.field_errors
    elif request.method == "POST":
        account = ServiceAccount.objects.filter(pk=request.POST.get("account") or 0).first()
        if account is None:
            raise Http404("no such service account")
        if request.POST.get("form") == "oauth_client":
            new_client, errors = _create_oauth_client(request, account.user)
        else:
            raw, errors = _create(request, account.user)
    accounts = ServiceAccount.objects.select_related("user").prefetch_related("user__groups")
    context = {
        "accounts": [
            {
                "account": a,
                "roles": [g.name for g in a.user.groups.all()],
                "scopes": _scope_choices(a.user),
                "teams": services.token_team_choices(a.user),
                "tokens": ApiToken.objects.filter(user=a.user)
                .select_related("team")
                .order_by("-created_at"),
                "oauth_clients": OAuthClient.objects.filter(application__user=a.user)
                .select_related("application")
                .annotate(last_token_at=Max("application__accesstoken__created")),
            }
            for a in accounts
        ],
        "roles": [r.value for r in Role],
        "new_secret": raw,
        "new_client": new_client,
        "oauth_token_minutes": settings.OAUTH_ACCESS_TOKEN_SECONDS // 60,
        "errors": errors,
        "form": request.POST if errors else {},
        "now": timezone.now(),
    }
    return render(request, "api/service_accounts.html", context, status=422 if errors else 200)
