"""Healing on the real stack, in a real browser: the portal renames a button, the run fails at the
step that clicks it, the operator describes it to the (fake) model, picks the renamed button on
the failed step's page, publishes version 2, and the next run goes on to its approval. On a copy
of the demo workflow of its own: the other tests run the demo workflow's version 1 on the same
installation."""

from __future__ import annotations

import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from playwright.sync_api import Browser, Page, expect

from pandaweb.core.roles import Role
from pandaweb.demo_portal.state import PortalState
from tests.e2e.conftest import Stack, workflow_import_and_publish
from tests.e2e.test_dashboard import log_in
from tests.e2e.test_phone import DESKTOP, PHONE, assert_no_sideways_scroll, keep
from tests.sessions.fake_model import FakeModel

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

EXAMPLE = Path(__file__).resolve().parents[2] / "workflows" / "examples" / "acme-pay-invoice.yaml"
SLUG = "acme-pay-healed"
NAME = "Pay an Acme invoice, healed"
# The demo workflow's step that clicks the pay form's button.
REVIEW_STEP = 11


def rename_review_button(stack: Stack, label: str) -> None:
    data = urllib.parse.urlencode({"review_button": label}).encode()
    # No proxy from the environment: this request is for the loopback portal only.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{stack.portal_url.rstrip('/')}/api/wording", data=data, timeout=10):
        pass


def import_and_publish(page: Page, stack: Stack) -> None:
    """A copy of the demo workflow of this test's own, against the stack's portal."""
    document = yaml.safe_load(
        EXAMPLE.read_text().replace("127.0.0.1:8001", stack.portal_url.removeprefix("http://"))
    )
    workflow_import_and_publish(page, stack, document | {"slug": SLUG, "name": NAME})


def launch(page: Page, stack: Stack) -> None:
    invoice = next(i for i in PortalState().invoices() if i.status == "open")
    page.goto(f"{stack.url}/workflows/{SLUG}/")
    page.get_by_role("link", name="Launch v").first.click()
    page.get_by_label("Invoice number").fill(invoice.number)
    page.get_by_label("Amount to pay").fill(f"{invoice.amount_due:.2f}")
    page.get_by_role("button", name="Launch run").click()


def pictures(
    browser: Browser, stack: Stack, url: str, tmp_path: Path, stem: str, *, showing: str = ""
) -> None:
    """The healing page at ``url`` on a desktop and on a phone (``showing`` scrolled into view),
    kept as ``<stem>-desktop.png`` and ``<stem>-phone.png``."""
    for size, device in ((DESKTOP, "desktop"), (PHONE, "phone")):
        context = browser.new_context(viewport=size, is_mobile=size is PHONE)
        look = context.new_page()
        try:
            log_in(look, stack, Role.OPERATORS)
            look.goto(url)
            shown = look.locator(".heal-candidates img").first
            look.wait_for_function("img => img.complete", arg=shown.element_handle())
            if showing:
                look.locator(showing).scroll_into_view_if_needed()
            assert_no_sideways_scroll(look)
            keep(look, tmp_path, f"{stem}-{device}.png")
        finally:
            context.close()


def test_a_renamed_button_is_healed_from_the_failed_step_and_the_next_version_runs(
    page: Page,
    browser: Browser,
    stack: Stack,
    fake_model: tuple[FakeModel, str],
    tmp_path: Path,
) -> None:
    stack.manage("demo_workflow")  # the portal's credential
    rename_review_button(stack, "Check the payment")
    log_in(page, stack, Role.OPERATORS)
    import_and_publish(page, stack)
    launch(page, stack)
    header = page.locator("#run-header")
    expect(header).to_contain_text("Failed", timeout=240_000)
    run_url = page.url.rstrip("/")

    page.goto(f"{run_url}/steps/{REVIEW_STEP}/")
    page.get_by_role("link", name="Find the element this step meant").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Find what step 'review' meant")
    best = page.locator(".heal-candidates > li").first
    expect(best.get_by_role("heading")).to_contain_text("button “Check the payment”")
    expect(best).to_contain_text("finds 1 element on that page")
    picture = best.get_by_role("img")
    picture.scroll_into_view_if_needed()
    # Drawn on request: the step's screenshot with this element outlined.
    page.wait_for_function("img => img.complete", arg=picture.element_handle())
    assert picture.evaluate("img => img.naturalWidth") > 0
    pictures(browser, stack, page.url, tmp_path, "healing")

    # Described to the model: a worker asks it while the page waits, and its choice comes into
    # the page in place, first among the candidates.
    model, _ = fake_model
    model.answering.clear()
    try:
        page.get_by_label("The element, in your words").fill("check the payment")
        page.get_by_role("button", name="Find it").click()
        said = page.locator("#heal-proposal [role=status]")
        expect(said).to_contain_text("Asking the model which element is “check the payment”…")
        page.evaluate("window.notReloaded = true")
        pictures(browser, stack, page.url, tmp_path, "healing-asking", showing="#heal-proposal")
    finally:
        model.answering.set()
    expect(said).to_contain_text("Proposed by the model fake-model", timeout=30_000)
    assert page.evaluate("window.notReloaded") is True
    expect(best).to_contain_text("the model's choice for 'check the payment'")
    expect(best.get_by_role("heading")).to_contain_text("button “Check the payment”")
    pictures(browser, stack, page.url, tmp_path, "healing-answered", showing="#heal-proposal")

    best.get_by_role("button", name="Use this element").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text(NAME)
    message = page.get_by_label("What changed")
    expect(message).to_have_value(
        f"Step 'review': the button 'Review payment' → the button 'Check the payment', "
        f"after run #{run_url.rsplit('/', 1)[1]} failed"
    )
    accept = page.get_by_label("Publish anyway: the warnings above are intended")
    if accept.count():
        accept.check()
    page.get_by_role("button", name="Publish version 2").click()
    expect(page.get_by_text("Published version 2")).to_be_visible()

    launch(page, stack)
    expect(header).to_contain_text("Awaiting approval", timeout=240_000)
