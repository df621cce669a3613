"""Sign-in (password or single sign-on), the provider's callback, and sign-out."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import auth
from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.models import User
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from pandaweb.sso import client, sessions
from pandaweb.sso.client import SsoRefused
from pandaweb.sso.forms import PasswordSignInForm
from pandaweb.sso.services import sso_refusal_record, sso_sign_in

_NEXT = "sso_next"


class SignInView(LoginView):
    authentication_form = PasswordSignInForm
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["sso"] = settings.OIDC
        context["local_passwords"] = settings.LOCAL_PASSWORDS
        return context


@login_not_required
@require_GET
def sso_start(request: HttpRequest) -> HttpResponse:
    oidc = settings.OIDC
    if oidc is None:
        return redirect("login")
    next_url = request.GET.get("next", "")
    if url_has_allowed_host_and_scheme(
        next_url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        request.session[_NEXT] = next_url
    try:
        return client.authorize_redirect(
            request, oidc, request.build_absolute_uri(reverse("sso_callback"))
        )
    except SsoRefused as refusal:
        return _refused(request, refusal)


@login_not_required
@require_GET
def sso_callback(request: HttpRequest) -> HttpResponse:
    oidc = settings.OIDC
    if oidc is None:
        return redirect("login")
    claims: dict[str, Any] = {}
    try:
        token, claims = client.callback_token(request, oidc)
        groups = client.groups(oidc, token, claims)
        user = sso_sign_in(oidc=oidc, claims=claims, groups=groups, request=request)
    except SsoRefused as refusal:
        return _refused(request, refusal, subject=str(claims.get("sub", "")))
    next_url = request.session.pop(_NEXT, "") or settings.LOGIN_REDIRECT_URL
    auth.login(request, user, backend="pandaweb.sso.backends.LocalPasswordBackend")
    sessions.tokens_remember(request, oidc=oidc, token=token, claims=claims)
    return redirect(next_url)


@login_not_required
@require_POST
def sign_out(request: HttpRequest) -> HttpResponse:
    """Ends the dashboard session, then the provider's too when it offers an end-session
    endpoint (so the next sign-in asks for credentials again)."""
    id_token = request.session.get(sessions.ID_TOKEN)
    auth.logout(request)
    signed_out = request.build_absolute_uri(reverse(settings.LOGOUT_REDIRECT_URL))
    oidc = settings.OIDC
    if oidc is None or not id_token:
        return redirect(settings.LOGOUT_REDIRECT_URL)
    try:
        end_session = client.metadata(oidc).get("end_session_endpoint")
    except SsoRefused:
        end_session = None  # the session here is over; the provider's ends on its own
    if not end_session:
        return redirect(settings.LOGOUT_REDIRECT_URL)
    query = urlencode(
        {
            "id_token_hint": id_token,
            "post_logout_redirect_uri": signed_out,
            "client_id": oidc.client_id,
        }
    )
    return HttpResponseRedirect(f"{end_session}?{query}")


def refused_page(request: HttpRequest, refusal: SsoRefused) -> HttpResponse:
    return render(request, "sso/refused.html", {"refusal": refusal}, status=refusal.status)


def _refused(request: HttpRequest, refusal: SsoRefused, *, subject: str = "") -> HttpResponse:
    user = request.user if isinstance(request.user, User) else None
    sso_refusal_record(refusal=refusal, request=request, subject=subject, user=user)
    return refused_page(request, refusal)
