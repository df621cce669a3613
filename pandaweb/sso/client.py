"""Talking to the OpenID Connect provider through Authlib, and naming what it refuses.

Authlib does the protocol: discovery, PKCE (S256), state and nonce kept in the session, the
token exchange, and the ID token's checks (signature against the provider's JWKS, fetched again
when a key id is new; issuer, audience, expiry, issue time, nonce, at_hash). This module turns
its exceptions into refusals a person can read.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import requests
from authlib.integrations.base_client.errors import MismatchingStateError, OAuthError
from authlib.integrations.django_client import DjangoOAuth2App, OAuth
from django.http import HttpRequest, HttpResponse
from joserfc.errors import (
    BadSignatureError,
    ClaimError,
    ExpiredTokenError,
    InvalidKeyIdError,
    JoseError,
)

from pandaweb.sso.config import OidcSettings

# Every call to the provider gives up after this long: a hung provider must not hold a worker.
PROVIDER_TIMEOUT_SECONDS = 10

REFUSALS: dict[str, str] = {
    "state": (
        "This sign-in answer does not belong to a sign-in started here, or it was used "
        "already. Start again from the sign-in page."
    ),
    "provider": "The identity provider did not sign you in.",
    "no_id_token": "The identity provider answered without an ID token, so nobody is signed in.",
    "signature": (
        "The identity provider's answer is not signed with any of its published keys "
        "(bad signature), so it cannot be trusted."
    ),
    "audience": (
        "The identity provider's answer was issued to another application (wrong audience)."
    ),
    "issuer": "The identity provider's answer was issued by another provider (wrong issuer).",
    "expired": (
        "The identity provider's answer has expired. If this keeps happening, check the "
        "clocks of this server and of the provider."
    ),
    "nonce": (
        "The identity provider's answer does not carry this sign-in's nonce, so it may be a "
        "replay of another sign-in."
    ),
    "token": "The identity provider's answer is not a valid ID token.",
    "unreachable": "pandaweb could not reach the identity provider. Try again in a minute.",
    "no_role": (
        "Your account at the identity provider is in no group that grants a role in "
        "pandaweb. Ask your administrator to add you to one."
    ),
    "name_taken": (
        "An account with your username already exists in pandaweb and is not linked to the "
        "identity provider. Ask your administrator to rename or remove it."
    ),
    "disabled": "Your pandaweb account is switched off. Ask your administrator.",
    "ended": (
        "The identity provider no longer confirms your sign-in (you were signed out there, "
        "or your access was removed). Sign in again."
    ),
}

_CLAIM_REFUSALS = {"aud": "audience", "azp": "audience", "iss": "issuer", "nonce": "nonce"}


@dataclass
class SsoRefused(Exception):
    """A sign-in (or a session's recheck) the provider's answer does not support."""

    code: str
    detail: str = ""

    @property
    def message(self) -> str:
        return REFUSALS[self.code]

    @property
    def status(self) -> int:
        return 502 if self.code == "unreachable" else 403


_apps: dict[tuple[str, str, str, str], DjangoOAuth2App] = {}


def provider(oidc: OidcSettings) -> DjangoOAuth2App:
    """The Authlib client for ``oidc``; its discovery document and keys are cached with it."""
    key = (oidc.discovery_url, oidc.client_id, oidc.client_secret, oidc.scopes)
    app = _apps.get(key)
    if app is None:
        app = OAuth().register(
            name="pandaweb",
            client_id=oidc.client_id,
            client_secret=oidc.client_secret,
            server_metadata_url=oidc.discovery_url,
            client_kwargs={
                "scope": oidc.scopes,
                "code_challenge_method": "S256",
                "default_timeout": PROVIDER_TIMEOUT_SECONDS,
            },
        )
        _apps[key] = app
    return app


def metadata(oidc: OidcSettings) -> dict[str, Any]:
    """The provider's discovery document, once its issuer is checked against the setting (a
    document naming another issuer would make every ID token check pass against the wrong one)."""
    with _refusing():
        document = provider(oidc).load_server_metadata()
    if str(document.get("issuer", "")).rstrip("/") != oidc.issuer:
        raise SsoRefused("issuer", f"discovery names issuer {document.get('issuer')!r}")
    return document


def authorize_redirect(request: HttpRequest, oidc: OidcSettings, redirect_uri: str) -> HttpResponse:
    """Off to the provider, with a fresh state, nonce and PKCE verifier kept in the session."""
    metadata(oidc)
    with _refusing():
        return provider(oidc).authorize_redirect(request, redirect_uri)


def callback_token(
    request: HttpRequest, oidc: OidcSettings
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The provider's tokens for this callback and the ID token's checked claims.

    Raises SsoRefused for anything the checks do not pass; the state is spent either way.
    """
    metadata(oidc)
    with _refusing():
        token = provider(oidc).authorize_access_token(request)
    if "userinfo" not in token:
        raise SsoRefused("no_id_token")
    return token, dict(token["userinfo"])


def refreshed_token(
    oidc: OidcSettings, refresh_token: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """New tokens for a signed-in session, and the new ID token's checked claims (the provider
    refuses a person it has disabled or removed)."""
    app = provider(oidc)
    metadata(oidc)
    with _refusing(provider_code="ended"):
        token = app.fetch_access_token(grant_type="refresh_token", refresh_token=refresh_token)
        # A refreshed ID token answers no authentication request, so it has no nonce to match.
        claims = app.parse_id_token(token, nonce=None)
    if claims is None:
        raise SsoRefused("no_id_token")
    return token, dict(claims)


def groups(oidc: OidcSettings, token: dict[str, Any], claims: dict[str, Any]) -> list[str]:
    """The person's groups: from the ID token, or from the userinfo endpoint when the provider
    keeps them out of ID tokens."""
    value = claims.get(oidc.groups_claim)
    if value is None:
        with _refusing():
            userinfo = provider(oidc).userinfo(token=token)
        if userinfo.get("sub") != claims.get("sub"):
            raise SsoRefused("token", "userinfo describes another subject")
        value = userinfo.get(oidc.groups_claim, [])
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise SsoRefused("token", f"the {oidc.groups_claim!r} claim is not a list")
    return [str(item) for item in value]


@contextmanager
def _refusing(provider_code: str = "provider") -> Iterator[None]:
    """Turns the library's exceptions into SsoRefused naming the check that failed."""
    try:
        yield
    except SsoRefused:
        raise
    except Exception as error:
        refusal = _refusal_for(error, provider_code)
        if refusal is None:
            raise
        raise refusal from error


def _refusal_for(error: BaseException, provider_code: str) -> SsoRefused | None:
    if isinstance(error, MismatchingStateError):
        return SsoRefused("state")
    if isinstance(error, OAuthError):
        return SsoRefused(provider_code, " ".join(filter(None, [error.error, error.description])))
    if isinstance(error, ExpiredTokenError):
        return SsoRefused("expired")
    if isinstance(error, ClaimError):
        return SsoRefused(_CLAIM_REFUSALS.get(error.claim, "token"), str(error))
    if isinstance(error, BadSignatureError | InvalidKeyIdError):
        return SsoRefused("signature", str(error))
    if isinstance(error, JoseError | ValueError):
        return SsoRefused("token", str(error))
    if isinstance(error, requests.RequestException):
        return SsoRefused("unreachable", type(error).__name__)
    return None
