"""The reviewer's pages on a phone (390 x 844) and a desktop (1440 x 900), in a real Chromium on a
real installation: nothing scrolls sideways, and the decision is on the first screen."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, ViewportSize, expect

from pandaweb.core.roles import Role
from pandaweb.demo_portal.state import PortalState
from tests.e2e.conftest import Stack
from tests.e2e.test_dashboard import log_in

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

PHONE: ViewportSize = {"width": 390, "height": 844}
DESKTOP: ViewportSize = {"width": 1440, "height": 900}
# Set to docs/screenshots to refresh the documentation's pictures from this run.
DOCS_SHOTS = os.environ.get("PANDAWEB_SCREENSHOT_DIR", "")


def assert_no_sideways_scroll(page: Page) -> None:
    width, inner = page.evaluate("[document.scrollingElement.scrollWidth, window.innerWidth]")
    assert width <= inner, f"{page.url} is {width} px wide in a {inner} px window"


def assert_in_first_screen(page: Page, selector: str) -> None:
    """Visible without scrolling: inside the viewport while the page is at the top."""
    page.evaluate("window.scrollTo(0, 0)")
    box = page.locator(selector).bounding_box()
    assert box is not None, selector
    height = page.viewport_size["height"] if page.viewport_size else 0
    assert box["y"] >= 0, (selector, box)
    assert box["y"] + box["height"] <= height, (selector, box)


def keep(page: Page, tmp_path: Path, name: str, *, full_page: bool = False) -> None:
    target = tmp_path / name
    page.screenshot(path=str(target), full_page=full_page)
    if DOCS_SHOTS:
        shutil.copy(target, Path(DOCS_SHOTS) / name)


def test_a_reviewer_decides_on_a_phone_without_scrolling_sideways_or_past_the_timeline(
    page: Page, browser: Browser, stack: Stack, tmp_path: Path
) -> None:
    stack.manage("demo_workflow")
    # The last open invoice: another test may pay the first one on this installation.
    invoice = [i for i in PortalState().invoices() if i.status == "open"][-1]
    log_in(page, stack, Role.OPERATORS)
    page.goto(f"{stack.url}/workflows/acme-pay-invoice/")
    page.get_by_role("link", name="Launch v1").click()
    page.get_by_label("Invoice number").fill(invoice.number)
    page.get_by_label("Amount to pay").fill(f"{invoice.amount_due:.2f}")
    page.get_by_role("button", name="Launch run").click()
    expect(page.locator("#run-header")).to_contain_text("Awaiting approval", timeout=240_000)
    run_url = page.url
    amount = f"{invoice.amount_due:,.2f} EUR"

    for size in (DESKTOP, PHONE):
        context = browser.new_context(
            viewport=size, is_mobile=size is PHONE, has_touch=size is PHONE
        )
        reviewer = context.new_page()
        reviewer.set_default_timeout(15_000)
        try:
            log_in(reviewer, stack, Role.REVIEWERS)
            expect(reviewer.get_by_role("button", name="Log out")).to_be_visible()
            assert_in_first_screen(reviewer, "button:text('Log out')")

            reviewer.goto(f"{stack.url}/")
            # Other tests share this installation: the request of this invoice.
            home_facts = reviewer.locator(".needs-list li").filter(has_text=invoice.number)
            expect(home_facts).to_contain_text(amount)
            expect(home_facts).to_contain_text("DE97 2004 0060 0123 4567 89")
            reviewer.goto(f"{stack.url}/approvals/")
            assert_no_sideways_scroll(reviewer)
            # Triage by the facts, as text: amount, payee, reference; the page's host, no URL.
            row = reviewer.locator(".queue-table tbody tr").filter(has_text=invoice.number)
            expect(row.locator(".queue-facts")).to_contain_text(amount)
            expect(row.locator(".queue-facts")).to_contain_text("DE97 2004 0060 0123 4567 89")
            expect(row.locator(".queue-facts")).to_contain_text(invoice.number)
            expect(row.locator(".queue-action")).not_to_contain_text("http")
            expect(row).not_to_contain_text("Expires expires")
            row.get_by_role("link", name="Click the button 'Submit payment'").click()
            expect(reviewer.get_by_role("heading", level=1)).to_contain_text("Submit payment")
            reviewer.wait_for_load_state("load")
            decision_url = reviewer.url
            assert_no_sideways_scroll(reviewer)
            # The action, the amount, the close-up of the target, the countdown and Approve:
            # all on the first screen, the timeline folded below.
            assert_in_first_screen(reviewer, "#action-heading")
            for fact in ("amount", "payee", "reference"):
                assert_in_first_screen(reviewer, f".decision-facts-large .fact-{fact}")
            expect(reviewer.locator(".decision-facts-large .fact-amount")).to_contain_text(amount)
            expect(reviewer.locator(".decision-facts-large .fact-warning")).to_have_count(0)
            assert_in_first_screen(reviewer, ".head-expiry .countdown")
            assert_in_first_screen(reviewer, "button.approve")
            crop = reviewer.locator(".approval-crop img")
            expect(crop).to_be_visible()
            assert (
                reviewer.evaluate("document.querySelector('.approval-crop img').naturalWidth") > 0
            )
            if size is PHONE:
                assert (crop.bounding_box() or {"y": 9999})["y"] < PHONE["height"]
            expect(reviewer.locator("details.approval-timeline")).not_to_have_attribute("open", "")
            keep(
                reviewer,
                tmp_path,
                "approval-decision-phone.png" if size is PHONE else "approval-decision.png",
                full_page=size is DESKTOP,
            )

            reviewer.goto(run_url)
            expect(reviewer.locator("#run-header")).to_contain_text("Awaiting approval")
            assert_no_sideways_scroll(reviewer)
            keep(reviewer, tmp_path, f"run-awaiting-approval-{size['width']}.png")
            reviewer.goto(f"{stack.url}/approvals/?status=all")
            assert_no_sideways_scroll(reviewer)
            keep(reviewer, tmp_path, f"approvals-queue-{size['width']}.png")
            if size is PHONE:
                # Reject needs a reason: the bar's Reject… opens a sheet that asks for it.
                reviewer.goto(decision_url)
                reviewer.get_by_role("link", name="Reject…").click()
                sheet = reviewer.locator("#reject-sheet")
                expect(sheet).to_be_visible()
                assert_no_sideways_scroll(reviewer)
                reviewer.get_by_label("Reason to reject").fill(
                    "Not this week: wait for the credit note"
                )
                keep(reviewer, tmp_path, "approval-reject-sheet-phone.png")
                sheet.get_by_role("button", name="Reject").click()
                # The outcome at the top of the page, in view; no countdown left.
                outcome = reviewer.locator("#decision-outcome")
                expect(outcome).to_contain_text("Rejected.", timeout=30_000)
                assert outcome.evaluate("e => e.getBoundingClientRect().top") >= 0
                expect(reviewer.locator(".approval-head .countdown")).to_have_count(0)
                expect(reviewer.locator(".decide-bar")).to_have_count(0)
        except Exception:
            print(reviewer.url, reviewer.locator("main").inner_text()[:3000], stack.log_tail(500))
            raise
        finally:
            context.close()


def test_the_tokens_and_audit_pages_fit_a_phone_with_a_token_and_events(
    page: Page, stack: Stack
) -> None:
    page.set_viewport_size(PHONE)
    log_in(page, stack, Role.ADMINS)
    page.goto(f"{stack.url}/account/tokens/")
    page.get_by_label("Name").fill("nightly ERP export with a long descriptive name")
    page.locator("input[name=scopes]:not([disabled])").first.check()
    page.get_by_role("button", name="Make token").click()
    expect(page.get_by_role("columnheader", name="State")).to_be_visible()
    assert_no_sideways_scroll(page)

    page.goto(f"{stack.url}/audit/")
    expect(page.locator("#audit-table tbody tr").first).to_be_visible()
    assert_no_sideways_scroll(page)
