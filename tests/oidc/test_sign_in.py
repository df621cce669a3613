"""The whole redirect dance in a real Chromium, against the real provider on loopback."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.sessions.backends.db import SessionStore
from playwright.sync_api import Browser, Page, expect, sync_playwright
from pytest_django.live_server_helper import LiveServer

from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from pandaweb.sso import sessions
from pandaweb.sso.config import OidcSettings
from pandaweb.sso.models import SsoIdentity
from sessions.engine.chromium import HEADLESS_ARGS, find_chromium
from tests.oidc.conftest import PASSWORD, Provider

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def chromium(django_db_setup: None) -> Iterator[Browser]:
    """This module's own Chromium: Playwright's sync API keeps an event loop on the test thread
    while it runs, so the database reads between browser steps are allowed explicitly, and the
    loop goes with the module (tests after it find none)."""
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        browser = playwright.chromium.launch(
            executable_path=find_chromium(settings.ENGINE_CONFIG.chromium),
            args=list(HEADLESS_ARGS),
            headless=True,
        )
        yield browser
        browser.close()


@pytest.fixture
def page(chromium: Browser) -> Iterator[Page]:
    context = chromium.new_context()
    page = context.new_page()
    page.set_default_timeout(10_000)
    yield page
    context.close()


def sign_in(page: Page, site: str, username: str) -> None:
    page.goto(f"{site}/login/")
    page.get_by_role("link", name="Sign in with Test IdP").click()
    expect(page.get_by_role("heading", name="Test identity provider")).to_be_visible()
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()


def roles_of(username: str) -> set[str]:
    return set(User.objects.get(username=username).groups.values_list("name", flat=True))


def recheck_now(page: Page) -> None:
    """The session's ID token is due: its next request asks the provider again."""
    cookie = next(c for c in page.context.cookies() if c["name"] == settings.SESSION_COOKIE_NAME)
    session = SessionStore(session_key=cookie["value"])
    session[sessions.RECHECK_AT] = 0
    session.save()


def test_a_person_signs_in_at_the_provider_and_lands_with_the_mapped_role(
    page: Page, live_server: LiveServer, oidc: OidcSettings
) -> None:
    sign_in(page, live_server.url, "olivia")

    expect(page).to_have_url(f"{live_server.url}/")
    expect(page.get_by_role("link", name=re.compile("olivia"))).to_contain_text("Operators")
    user = User.objects.get(username="olivia")
    assert roles_of("olivia") == {Role.OPERATORS.value}
    assert not user.has_usable_password()
    assert SsoIdentity.objects.get(user=user).issuer == oidc.issuer
    actions = list(AuditEvent.objects.filter(actor_id=user.pk).values_list("action", flat=True))
    assert "auth.sso_signed_in" in actions
    assert "auth.logged_in" in actions


def test_a_person_moved_at_the_provider_gets_the_new_role_at_the_recheck(
    page: Page, live_server: LiveServer, oidc: OidcSettings, provider: Provider
) -> None:
    sign_in(page, live_server.url, "rory")
    expect(page).to_have_url(f"{live_server.url}/")
    assert roles_of("rory") == {Role.REVIEWERS.value}

    provider.move("rory", "pw-operators")
    recheck_now(page)
    page.reload()

    expect(page.get_by_role("link", name=re.compile("rory"))).to_contain_text("Operators")
    assert roles_of("rory") == {Role.OPERATORS.value}
    provider.move("rory", "pw-reviewers")


def test_requests_that_fall_due_together_ask_the_provider_once(
    page: Page, live_server: LiveServer, oidc: OidcSettings, provider: Provider
) -> None:
    """The provider rotates refresh tokens: a token spent twice would be refused and sign the
    person out, or be answered with an ID token that does not match its access token."""
    sign_in(page, live_server.url, "olivia")
    expect(page).to_have_url(f"{live_server.url}/")
    refreshes = (
        "SELECT COUNT(*) FROM oauth2_provider_refreshtoken "
        "WHERE user_id = (SELECT id FROM auth_user WHERE username = ?)"
    )
    issued = provider.count(refreshes, "olivia")

    for wave in range(1, 4):  # the requests overlap at the provider in some waves, not all
        recheck_now(page)
        statuses = page.evaluate(
            "Promise.all([...Array(6).keys()].map(() => fetch('/runs/').then(r => r.status)))"
        )
        assert statuses == [200] * 6
        assert provider.count(refreshes, "olivia") == issued + wave
    page.reload()
    expect(page.get_by_role("link", name=re.compile("olivia"))).to_contain_text("Operators")
    assert not AuditEvent.objects.filter(action="auth.sso_refused").exists()


def test_a_person_switched_off_at_the_provider_is_signed_out_at_the_recheck(
    page: Page, live_server: LiveServer, oidc: OidcSettings, provider: Provider
) -> None:
    provider.move("visitor", "pw-reviewers")
    sign_in(page, live_server.url, "visitor")
    expect(page).to_have_url(f"{live_server.url}/")

    provider.switch_off("visitor")
    recheck_now(page)
    page.reload()

    expect(page.get_by_role("alert")).to_contain_text("no longer confirms your sign-in")
    page.goto(f"{live_server.url}/")
    expect(page).to_have_url(re.compile(r"/login/"))
    # Each request the page had under way when the recheck fell due (the reload, the home
    # page's live connection) meets the refusal and records it.
    refusals = AuditEvent.objects.filter(action="auth.sso_refused")
    assert {(r.object_id, r.actor_label) for r in refusals} == {("ended", "visitor")}


def test_a_person_in_no_mapped_group_is_refused_in_words(
    page: Page, live_server: LiveServer, oidc: OidcSettings, provider: Provider
) -> None:
    provider.move("visitor", "staff")
    provider.sql("UPDATE auth_user SET is_active = 1 WHERE username = 'visitor'")
    sign_in(page, live_server.url, "visitor")

    expect(page.get_by_role("alert")).to_contain_text("in no group that grants a role")
    assert not User.objects.filter(username="visitor").exists()


def test_signing_out_ends_the_dashboard_session_and_the_providers(
    page: Page, live_server: LiveServer, oidc: OidcSettings
) -> None:
    sign_in(page, live_server.url, "olivia")
    expect(page).to_have_url(f"{live_server.url}/")

    page.get_by_role("button", name="Log out").click()

    expect(page).to_have_url(f"{live_server.url}/login/")
    stored = SessionStore.get_model_class().objects.all()
    assert not [s for s in stored if "_auth_user_id" in s.get_decoded()]
    # The provider forgot the person too: signing in again asks for the password.
    page.get_by_role("link", name="Sign in with Test IdP").click()
    expect(page.get_by_label("Password")).to_be_visible()


def test_a_replayed_callback_is_refused_in_words(
    page: Page, live_server: LiveServer, oidc: OidcSettings
) -> None:
    callbacks: list[str] = []
    page.on("request", lambda r: callbacks.append(r.url) if "/sso/callback/" in r.url else None)
    sign_in(page, live_server.url, "olivia")
    expect(page).to_have_url(f"{live_server.url}/")

    page.goto(callbacks[0])

    expect(page.get_by_role("alert")).to_contain_text("used already")
    assert AuditEvent.objects.filter(action="auth.sso_refused", object_id="state").exists()
