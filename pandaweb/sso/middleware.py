"""Asks the identity provider again about a signed-in person once their ID token is due.

A person removed at the provider, or taken out of every mapped group, loses the session at the
first request after the recheck time; one moved between groups gets the new roles then.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib import auth
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse

from pandaweb.sso import client, sessions
from pandaweb.sso.client import SsoRefused
from pandaweb.sso.services import sso_refusal_record, sso_session_recheck
from pandaweb.sso.views import refused_page


class SsoRecheckMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user = request.user
        if settings.OIDC is not None and isinstance(user, User) and sessions.recheck_due(request):
            with sessions.recheck_turn(request) as stored:
                refusal = _recheck_in_turn(request, user, stored)
                if refusal is not None:
                    sso_refusal_record(
                        refusal=refusal, request=request, user=user, subject=_subject(user)
                    )
                    auth.logout(request)
            if refusal is not None:
                response = refused_page(request, refusal)
                if request.headers.get("HX-Request"):
                    response["HX-Refresh"] = "true"  # a fragment swap would hide the page
                return response
        return self.get_response(request)


def _recheck_in_turn(
    request: HttpRequest, user: User, stored: dict[str, Any] | None
) -> SsoRefused | None:
    if stored is None:
        return SsoRefused("ended", "another request's recheck ended this session")
    if sessions.recheck_adopt(request, stored):
        return None
    refusal = _recheck(request, user)
    if refusal is None:
        # Saved while the turn is held, so the requests waiting for it find the new tokens.
        request.session.save()
    return refusal


def _recheck(request: HttpRequest, user: User) -> SsoRefused | None:
    oidc = settings.OIDC
    assert oidc is not None
    refresh_token = request.session.get(sessions.REFRESH_TOKEN)
    if not refresh_token:
        return SsoRefused("ended", "the provider issued no refresh token")
    try:
        token, claims = client.refreshed_token(oidc, refresh_token)
        groups = client.groups(oidc, token, claims)
        sso_session_recheck(oidc=oidc, user=user, claims=claims, groups=groups)
    except SsoRefused as refusal:
        return refusal
    sessions.tokens_remember(request, oidc=oidc, token=token, claims=claims)
    return None


def _subject(user: User) -> str:
    identity = getattr(user, "sso_identity", None)
    return identity.subject if identity is not None else ""
