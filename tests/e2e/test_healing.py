"""Healing on the real stack, in a real browser: the portal renames a button, the run fails at the
step that clicks it, the operator picks the renamed button on the failed step's page, publishes
version 2, and the next run goes on to its approval. On a copy of the demo workflow of its own:
the other tests run the demo workflow's version 1 on the same installation."""

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


def test_a_renamed_button_is_healed_from_the_failed_step_and_the_next_version_runs(
    page: Page, browser: Browser, stack: Stack, tmp_path: Path
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
    heal_url = page.url
    for size, name in ((DESKTOP, "healing-desktop.png"), (PHONE, "healing-phone.png")):
        context = browser.new_context(viewport=size, is_mobile=size is PHONE)
        look = context.new_page()
        try:
            log_in(look, stack, Role.OPERATORS)
            look.goto(heal_url)
            shown = look.locator(".heal-candidates img").first
            look.wait_for_function("img => img.complete", arg=shown.element_handle())
            assert_no_sideways_scroll(look)
            keep(look, tmp_path, name)
        finally:
            context.close()

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
