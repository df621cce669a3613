"""Password sign-in beside single sign-on: on by default, off for all but break-glass."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from pytest_django.fixtures import Settings

from pandaweb import settings as project_settings
from pandaweb.core.roles import Role
from pandaweb.sso.config import Grant, OidcSettings, parse_role_map
from tests.factories import PASSWORD, user_with_role

pytestmark = pytest.mark.django_db

SSO = OidcSettings(
    issuer="http://127.0.0.1:9/o",
    client_id="pandaweb",
    client_secret="secret",
    discovery_url="http://127.0.0.1:9/o/.well-known/openid-configuration",
    label="Example SSO",
    role_map=parse_role_map("ops=operators"),
)


@pytest.fixture
def passwords_off(settings: Settings) -> None:
    settings.OIDC = SSO
    settings.LOCAL_PASSWORDS = False
    settings.BREAK_GLASS_ADMIN = "ada.breakglass"


def test_the_login_page_offers_single_sign_on_beside_passwords(
    client: Client, settings: Settings
) -> None:
    settings.OIDC = SSO

    page = client.get("/login/").content.decode()

    assert "Sign in with Example SSO" in page
    assert 'name="password"' in page
    assert "Break-glass" not in page


def test_the_login_page_has_no_single_sign_on_unless_configured(client: Client) -> None:
    assert "Sign in with" not in client.get("/login/").content.decode()


@pytest.mark.usefixtures("passwords_off")
def test_it_refuses_a_password_in_words_when_passwords_are_off(client: Client) -> None:
    user_with_role(Role.OPERATORS, username="olivia")

    response = client.post("/login/", {"username": "olivia", "password": PASSWORD})

    assert response.status_code == 200
    assert "Password sign-in is switched off here" in response.content.decode()
    assert client.get("/").status_code == 302


@pytest.mark.usefixtures("passwords_off")
def test_the_break_glass_admin_still_signs_in_with_a_password(client: Client) -> None:
    user_with_role(Role.ADMINS, username="ada.breakglass")

    response = client.post("/login/", {"username": "ada.breakglass", "password": PASSWORD})

    assert response.status_code == 302
    assert client.get("/").status_code == 200


@pytest.mark.usefixtures("passwords_off")
def test_the_admins_login_refuses_passwords_too(client: Client) -> None:
    user_with_role(Role.ADMINS, username="olivia", is_staff=True, is_superuser=True)

    client.post("/admin/login/", {"username": "olivia", "password": PASSWORD})

    assert client.get("/admin/").status_code == 302


def test_a_role_map_names_roles_it_knows() -> None:
    assert parse_role_map(
        "ops=operators, ops=Reviewers,audit=compliance,ap-leads=reviewers@Payables"
    ) == {
        "ops": frozenset({Grant(Role.OPERATORS), Grant(Role.REVIEWERS)}),
        "audit": frozenset({Grant(Role.COMPLIANCE)}),
        "ap-leads": frozenset({Grant(Role.REVIEWERS, "payables")}),
    }
    with pytest.raises(ValueError, match="'wizards' is not a role"):
        parse_role_map("ops=wizards")
    with pytest.raises(ValueError, match="is not group=role"):
        parse_role_map("ops")
    with pytest.raises(ValueError, match="admins hold the whole installation"):
        parse_role_map("it=admins@payables")
    with pytest.raises(ValueError, match="is not a team's short name"):
        parse_role_map("ap=operators@")


def test_an_issuer_without_its_client_secret_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:

    monkeypatch.setenv("PANDAWEB_OIDC_ISSUER", "https://idp.example.com")
    monkeypatch.setenv("PANDAWEB_OIDC_CLIENT_ID", "pandaweb")
    monkeypatch.delenv("PANDAWEB_OIDC_CLIENT_SECRET", raising=False)
    with pytest.raises(ImproperlyConfigured, match="PANDAWEB_OIDC_CLIENT_SECRET must be too"):
        project_settings.oidc_settings()
