"""ID tokens the provider's answer might carry, checked against the real provider's JWKS.

The token exchange is the one step stood in for: it hands back a token crafted here, signed
with the provider's own key (or another), so each check is exercised alone.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.test import Client
from joserfc import jwt
from joserfc.jwk import RSAKey

from pandaweb.audit.models import AuditEvent
from pandaweb.sso.config import OidcSettings
from tests.oidc.conftest import CLIENT_ID, Provider

pytestmark = pytest.mark.django_db

OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
)


def started(client: Client) -> dict[str, str]:
    """Starts a sign-in; the provider's authorization request's parameters."""
    response = client.get("/sso/start/")
    assert response.status_code == 302
    return {
        key: values[0] for key, values in parse_qs(urlsplit(response["Location"]).query).items()
    }


def answer(
    client: Client,
    monkeypatch: pytest.MonkeyPatch,
    provider: Provider,
    state: str,
    claims: dict[str, Any],
    *,
    key: bytes | str | None = None,
) -> Any:
    kid = requests.get(f"{provider.url}/.well-known/jwks.json", timeout=5).json()["keys"][0]["kid"]
    signing_key = RSAKey.import_key(key or provider.private_key_pem)
    id_token = jwt.encode({"alg": "RS256", "kid": kid}, claims, signing_key)
    monkeypatch.setattr(
        "authlib.integrations.django_client.DjangoOAuth2App.fetch_access_token",
        lambda self, **params: {"access_token": "a", "token_type": "Bearer", "id_token": id_token},
    )
    return client.get("/sso/callback/", {"code": "the-code", "state": state})


def claims_for(oidc: OidcSettings, sent_nonce: str, **changes: Any) -> dict[str, Any]:
    now = int(time.time())
    claims = {
        "iss": oidc.issuer,
        "sub": "7",
        "aud": CLIENT_ID,
        "iat": now,
        "exp": now + 300,
        "nonce": sent_nonce,
        "preferred_username": "olivia",
        "groups": ["pw-operators"],
    }
    claims.update(changes)
    return {name: value for name, value in claims.items() if value is not None}


def test_it_asks_for_code_with_pkce_state_and_nonce(client: Client, oidc: OidcSettings) -> None:
    request = started(client)

    assert request["response_type"] == "code"
    assert request["code_challenge_method"] == "S256"
    assert len(request["code_challenge"]) >= 43
    assert request["state"]
    assert request["nonce"]
    assert set(request["scope"].split()) == {"openid", "profile", "email", "groups"}


def test_a_token_passing_every_check_signs_in(
    client: Client, monkeypatch: pytest.MonkeyPatch, oidc: OidcSettings, provider: Provider
) -> None:
    request = started(client)

    response = answer(
        client, monkeypatch, provider, request["state"], claims_for(oidc, request["nonce"])
    )

    assert response.status_code == 302
    assert client.get("/").status_code == 200


@pytest.mark.parametrize(
    ("changes", "signing_key", "reason", "words"),
    [
        ({"aud": "another-application"}, None, "audience", "wrong audience"),
        ({"exp": int(time.time()) - 600}, None, "expired", "has expired"),
        ({}, OTHER_KEY, "signature", "bad signature"),
        ({"nonce": None}, None, "nonce", "nonce"),
        ({"iss": "http://127.0.0.1:1/o"}, None, "issuer", "wrong issuer"),
    ],
    ids=["wrong-audience", "expired", "bad-signature", "missing-nonce", "wrong-issuer"],
)
def test_it_refuses_a_token_that_fails_a_check_with_a_clear_page(
    client: Client,
    monkeypatch: pytest.MonkeyPatch,
    oidc: OidcSettings,
    provider: Provider,
    changes: dict[str, Any],
    signing_key: bytes | None,
    reason: str,
    words: str,
) -> None:
    request = started(client)

    response = answer(
        client,
        monkeypatch,
        provider,
        request["state"],
        claims_for(oidc, request["nonce"], **changes),
        key=signing_key,
    )

    assert response.status_code == 403
    assert words in response.content.decode()
    assert client.get("/").status_code == 302  # still signed out
    event = AuditEvent.objects.get(action="auth.sso_refused")
    assert event.object_id == reason


def test_it_refuses_an_answer_whose_state_it_never_sent(
    client: Client, monkeypatch: pytest.MonkeyPatch, oidc: OidcSettings, provider: Provider
) -> None:
    request = started(client)

    response = answer(
        client, monkeypatch, provider, "forged-state", claims_for(oidc, request["nonce"])
    )

    assert response.status_code == 403
    assert "Start again from the sign-in page" in response.content.decode()
    assert AuditEvent.objects.get(action="auth.sso_refused").object_id == "state"


def test_it_shows_the_providers_own_refusal(client: Client, oidc: OidcSettings) -> None:
    request = started(client)

    response = client.get(
        "/sso/callback/",
        {"error": "access_denied", "error_description": "not allowed", "state": request["state"]},
    )

    assert response.status_code == 403
    assert "did not sign you in" in response.content.decode()
    assert "access_denied not allowed" in response.content.decode()
