from __future__ import annotations

import pytest

from pandaweb.audit.redaction import REDACTED, is_secret_key, redact


@pytest.mark.parametrize(
    "key",
    [
        "password",
        "Password",
        "new_password",
        "userPassword",
        "passwd",
        "pass",
        "db-pass",
        "passphrase",
        "client_secret",
        "access_token",
        "accessToken",
        "seed",
        "recovery_seed_phrase",
        "totp",
        "totp_uri",
        "otp",
        "otp_code",
        "api_key",
        "apiKey",
        "API-KEY",
        "private_key",
        "privateKey",
        "key_material",
        "ciphertext",
        "Authorization",
        "cookie",
        "pin",
        "card_pin",
    ],
)
def test_it_recognises_secret_keys(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    ["username", "passenger", "compass", "footprint", "shipping", "value", "amount", "keyword"],
)
def test_it_leaves_ordinary_keys_alone(key: str) -> None:
    assert not is_secret_key(key)


def test_it_redacts_at_any_depth_without_touching_the_original() -> None:
    original = {
        "username": "olivia",
        "password": "hunter2",
        "portal": {"url": "https://bank.example", "login": {"apiKey": "k-123"}},
        "steps": [{"fill": "#otp", "totp_secret": "JBSWY3DP"}],
    }

    redacted = redact(original)

    assert redacted == {
        "username": "olivia",
        "password": REDACTED,
        "portal": {"url": "https://bank.example", "login": {"apiKey": REDACTED}},
        "steps": [{"fill": "#otp", "totp_secret": REDACTED}],
    }
    assert original["password"] == "hunter2"


def test_it_hides_whole_structures_under_a_secret_key() -> None:
    assert redact({"secrets": {"a": 1, "b": [2]}}) == {"secrets": REDACTED}


def test_it_keeps_none_and_booleans_which_say_whether_a_secret_is_set() -> None:
    assert redact({"password": None, "totp_enabled": True, "token": ""}) == {
        "password": None,
        "totp_enabled": True,
        "token": REDACTED,
    }


def test_it_redacts_the_value_of_a_credential_payload() -> None:
    nested = {"credential": {"name": "bank login", "value": "hunter2"}, "value": 3}
    payload = {"name": "bank login", "value": "hunter2"}

    assert redact(nested) == {"credential": {"name": "bank login", "value": REDACTED}, "value": 3}
    assert redact(payload, credential=True) == {"name": "bank login", "value": REDACTED}
    assert redact(payload) == payload


def test_it_leaves_scalars_alone() -> None:
    assert redact("hunter2") == "hunter2"
    assert redact(None) is None
