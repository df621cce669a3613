"""Passkey step-up, in a real Chromium with a virtual authenticator (CDP ``WebAuthn`` domain):
a reviewer registers a passkey on their profile page, approves on the decision page with a
fresh assertion bound to the request's evidence, and ``approval_decide`` refuses verdicts
without one, with one made for another request, and with one already spent."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connections, transaction
from playwright.sync_api import Browser, Page, sync_playwright
from pytest_django.fixtures import Settings
from pytest_django.live_server_helper import LiveServer

from approvals import passkeys
from approvals import services as approvals
from approvals.models import ApprovalRequest
from pandaweb.core.roles import Role
from pandaweb.reviewers.models import Passkey, StepUpChallenge
from sessions.engine.chromium import HEADLESS_ARGS, find_chromium
from tests.approvals.reach import background, open_request, reach_workflow
from tests.factories import PASSWORD, user_with_role
from workflows.models import Workflow

__all__ = ["background"]

A = ApprovalRequest.Status
T = TypeVar("T")
pytestmark = pytest.mark.django_db(transaction=True)

# Asks the server for a step-up challenge and the authenticator for an assertion, without
# deciding: the test then hands the assertion to the service itself.
ASSERT_ONLY = """async (url) => {
  const token = document.querySelector("input[name=csrfmiddlewaretoken]").value;
  const response = await fetch(url, {method: "POST", headers: {"X-CSRFToken": token}});
  const options = await response.json();
  const credential = await navigator.credentials.get(
    {publicKey: PublicKeyCredential.parseRequestOptionsFromJSON(options)});
  return JSON.stringify(credential.toJSON());
}"""


@pytest.fixture(scope="module")
def chromium(django_db_setup: None) -> Iterator[Browser]:
    """This module's own Chromium. Playwright's sync API keeps an event loop on the test thread
    while it runs, so it is stopped with the module, and the database tests after it find no
    loop there. Meanwhile the tests' service calls run on another thread (``on_django``); only
    the database flush after each test runs here, and it is plain synchronous code."""
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        browser = playwright.chromium.launch(
            executable_path=find_chromium(settings.ENGINE_CONFIG.chromium),
            args=list(HEADLESS_ARGS),
            headless=True,
        )
        yield browser
        browser.close()
    on_django(connections.close_all)  # the service thread's connection, before the test DB goes


_django = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-django")


def on_django(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``function`` on a thread without an event loop (where services may publish)."""
    return _django.submit(function, *args, **kwargs).result()


def verify_in_transaction(approval: ApprovalRequest, user: User, assertion: str) -> None:
    with transaction.atomic():  # as approval_decide calls it: the nonce is locked and spent
        passkeys.step_up_verify(approval=approval, user=user, assertion=assertion)


@pytest.fixture
def site(django_db_setup: None, live_server: LiveServer, settings: Settings, tmp_path: Any) -> str:
    # (The test database first: once the browser runs, this thread has an event loop.)
    # A passkey's relying party is a host name: localhost (a secure context over plain http).
    settings.PANDAWEB_BASE_URL = live_server.url.replace("127.0.0.1", "localhost")
    settings.RUN_FILES_DIR = tmp_path / "runs"
    return str(settings.PANDAWEB_BASE_URL)


def with_authenticator(context: Any, page: Page) -> tuple[Any, str]:
    """A platform authenticator on ``page`` that verifies its user on every use: its CDP
    session and id."""
    cdp = context.new_cdp_session(page)
    cdp.send("WebAuthn.enable")
    added = cdp.send(
        "WebAuthn.addVirtualAuthenticator",
        {
            "options": {
                "protocol": "ctap2",
                "transport": "internal",
                "hasResidentKey": True,
                "hasUserVerification": True,
                "isUserVerified": True,
                "automaticPresenceSimulation": True,
            }
        },
    )
    return cdp, added["authenticatorId"]


def register_passkey(page: Page, site: str, name: str) -> None:
    page.goto(f"{site}/profile/")
    page.get_by_label("Name").fill(name)
    page.get_by_role("button", name="Register a passkey").click()
    page.get_by_text(f"{name} is registered.").wait_for()


@pytest.fixture
def authenticated_page(chromium: Browser) -> Iterator[Page]:
    """A page with a platform authenticator that verifies its user on every use."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    with_authenticator(context, page)
    yield page
    context.close()


@pytest.fixture
def workflow(operator: User, acme_credential: Any) -> Workflow:
    return reach_workflow(operator, passkey="above", passkey_above_amount="1000.00")


def log_in(page: Page, site: str, username: str) -> None:
    page.goto(f"{site}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{site}/")


def test_a_reviewer_approves_with_a_passkey_and_no_other_assertion_counts(
    site: str,
    authenticated_page: Page,
    operator: User,
    workflow: Workflow,
    background: list[dict[str, Any]],
) -> None:
    page = authenticated_page
    rory = on_django(user_with_role, Role.REVIEWERS, username="rory")
    first = on_django(open_request, operator, workflow)
    second = on_django(open_request, operator, workflow)
    assert on_django(passkeys.passkey_required, first)  # 1,250.00 EUR is above 1000.00

    log_in(page, site, "rory")
    register_passkey(page, site, "Virtual key")
    passkey = on_django(Passkey.objects.get, user=rory)
    assert passkey.name == "Virtual key"

    # Without an assertion: refused, by the service every adapter calls.
    with pytest.raises(approvals.ApprovalRefused, match="needs your passkey"):
        on_django(
            approvals.approval_decide,
            approval_id=first.pk,
            user=rory,
            approve=True,
            evidence_sha256=first.evidence_sha256,
        )

    # An assertion made for the second request does not approve the first.
    page.goto(f"{site}/approvals/{second.pk}/")
    for_second = page.evaluate(ASSERT_ONLY, f"/approvals/{second.pk}/passkey/")
    with pytest.raises(approvals.ApprovalRefused, match="made for another request"):
        on_django(
            approvals.approval_decide,
            approval_id=first.pk,
            user=rory,
            approve=True,
            evidence_sha256=first.evidence_sha256,
            passkey_assertion=for_second,
        )
    on_django(first.refresh_from_db)
    assert first.status == A.PENDING
    assert not on_django(first.decisions.exists)

    # The second request's assertion is good for the second request, once.
    on_django(
        approvals.approval_decide,
        approval_id=second.pk,
        user=rory,
        approve=True,
        evidence_sha256=second.evidence_sha256,
        passkey_assertion=for_second,
    )
    on_django(second.refresh_from_db)
    assert second.status == A.APPROVED
    with pytest.raises(passkeys.StepUpRefused, match="already used"):
        on_django(verify_in_transaction, second, rory, for_second)

    # On the page: Approve asks the authenticator, and the verdict goes with its assertion.
    page.goto(f"{site}/approvals/{first.pk}/")
    page.get_by_text("Approve and Reject ask for your passkey").wait_for()
    page.get_by_role("button", name="Approve with your passkey").click()
    page.get_by_text("Approved.").first.wait_for()
    on_django(first.refresh_from_db)
    assert first.status == A.APPROVED
    assert on_django(lambda: first.decisions.get().reviewer) == rory
    spent = on_django(
        lambda: StepUpChallenge.objects.select_related("user").get(
            approval=first, used_at__isnull=False
        )
    )
    assert spent.user == rory

    on_django(passkey.refresh_from_db)
    assert passkey.last_used_at is not None
    assert passkey.sign_count >= 2  # the authenticator's counter, kept against cloned keys


def test_it_refuses_an_assertion_replayed_by_another_reviewer(
    site: str,
    authenticated_page: Page,
    operator: User,
    workflow: Workflow,
    background: list[dict[str, Any]],
) -> None:
    page = authenticated_page
    rory = on_django(user_with_role, Role.REVIEWERS, username="rory")
    rita = on_django(user_with_role, Role.REVIEWERS, username="rita")
    approval = on_django(open_request, operator, workflow, quorum=2)

    log_in(page, site, "rory")
    register_passkey(page, site, "Rory's key")
    page.goto(f"{site}/approvals/{approval.pk}/")
    assertion = page.evaluate(ASSERT_ONLY, f"/approvals/{approval.pk}/passkey/")

    with pytest.raises(approvals.ApprovalRefused, match="made for another request"):
        on_django(
            approvals.approval_decide,
            approval_id=approval.pk,
            user=rita,
            approve=True,
            evidence_sha256=approval.evidence_sha256,
            passkey_assertion=assertion,
        )
    on_django(
        approvals.approval_decide,
        approval_id=approval.pk,
        user=rory,
        approve=True,
        evidence_sha256=approval.evidence_sha256,
        passkey_assertion=assertion,
    )
    assert on_django(lambda: [d.reviewer for d in approval.decisions.all()]) == [rory]


@pytest.fixture
def phone(chromium: Browser) -> Iterator[tuple[Page, Any, str]]:
    """A phone-sized page with a platform authenticator, its CDP session and its id."""
    context = chromium.new_context(
        viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True
    )
    page = context.new_page()
    page.set_default_timeout(15_000)
    cdp, authenticator = with_authenticator(context, page)
    yield page, cdp, authenticator
    context.close()


def in_view(page: Page, selector: str) -> bool:
    return bool(
        page.eval_on_selector(
            selector,
            "e => { const r = e.getBoundingClientRect();"
            " return r.height > 0 && r.top >= 0 && r.bottom <= innerHeight; }",
        )
    )


def test_on_a_phone_every_tap_says_what_it_asks_and_how_it_ended(
    site: str,
    phone: tuple[Page, Any, str],
    operator: User,
    workflow: Workflow,
    background: list[dict[str, Any]],
) -> None:
    page, cdp, authenticator = phone
    on_django(user_with_role, Role.REVIEWERS, username="rory")
    approval = on_django(open_request, operator, workflow)
    log_in(page, site, "rory")
    url = f"{site}/approvals/{approval.pk}/"

    # Without a passkey there is nothing to tap, and the page says why and where to get one.
    page.goto(url)
    missing = page.locator("#passkey-missing")
    assert "the amount, 1,250.00 EUR, is above 1,000.00" in missing.inner_text()
    assert page.get_by_role("button", name="Approve with your passkey").count() == 0

    register_passkey(page, site, "Phone")

    # The bar fixed to the bottom of the first screen says what Approve asks for.
    page.goto(url)
    approve = page.get_by_role("button", name="Approve with your passkey")
    assert in_view(page, ".decide-bar button.approve")
    assert "ask for your passkey" in page.locator("#passkey-step-up").inner_text()

    # A check the person does not confirm: said beside the buttons, in view, nothing recorded.
    cdp.send(
        "WebAuthn.setUserVerified", {"authenticatorId": authenticator, "isUserVerified": False}
    )
    approve.click()
    error = page.locator("#passkey-error")
    error.wait_for()
    assert "Nothing was recorded" in error.inner_text()
    assert in_view(page, "#passkey-error")
    assert not on_django(approval.decisions.exists)

    # Confirmed: the outcome at the top of the page, in view, and no countdown left.
    cdp.send("WebAuthn.setUserVerified", {"authenticatorId": authenticator, "isUserVerified": True})
    approve.click()
    outcome = page.locator("#decision-outcome .decision-outcome")
    outcome.wait_for()
    assert outcome.inner_text().startswith("Approved.")
    assert in_view(page, "#decision-outcome .decision-outcome")
    assert page.locator(".approval-head .countdown").count() == 0
    assert page.locator("#head-state").inner_text() == "Approved"


def test_a_browser_without_passkeys_is_told_before_the_tap(
    site: str,
    phone: tuple[Page, Any, str],
    operator: User,
    workflow: Workflow,
    background: list[dict[str, Any]],
) -> None:
    page, _, _ = phone
    on_django(user_with_role, Role.REVIEWERS, username="rory")
    approval = on_django(open_request, operator, workflow)
    log_in(page, site, "rory")
    register_passkey(page, site, "Phone")

    page.add_init_script("delete window.PublicKeyCredential")
    page.goto(f"{site}/approvals/{approval.pk}/")

    error = page.locator("#passkey-error")
    error.wait_for()
    assert "This browser cannot use passkeys" in error.inner_text()
    assert page.get_by_role("button", name="Approve with your passkey").is_disabled()
