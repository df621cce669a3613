from __future__ import annotations

import json
import re
import urllib.request
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, Page, expect

from pandaweb.core.roles import Role
from pandaweb.demo_portal.state import PortalState
from tests.e2e.conftest import Stack
from tests.e2e.test_dashboard import log_in

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


def test_the_demo_workflow_waits_for_a_reviewer_then_pays_once(
    page: Page, browser: Browser, stack: Stack
) -> None:
    stack.manage("demo_workflow")
    # The portal starts from the same fixed data every time.
    invoice = next(i for i in PortalState().invoices() if i.status == "open")
    log_in(page, stack, Role.OPERATORS)
    page.goto(f"{stack.url}/workflows/acme-pay-invoice/")

    page.get_by_role("link", name="Launch v1").click()
    page.get_by_label("Invoice number").fill(invoice.number)
    page.get_by_label("Amount to pay").fill(f"{invoice.amount_due:.2f}")
    page.get_by_role("button", name="Launch run").click()

    # Steps arrive over the websocket while the run executes.
    timeline = page.locator("#timeline .timeline-step")
    expect(timeline.first).to_be_visible(timeout=60_000)
    expect(timeline).to_have_count(13, timeout=180_000)
    header = page.locator("#run-header")
    expect(header).to_contain_text("Awaiting approval", timeout=30_000)
    expect(page.locator("#step-5")).to_contain_text("Extract total (money)")
    # The invoice was downloaded as evidence; nothing was paid.
    expect(page.get_by_role("link", name=f"{invoice.number}.csv")).to_be_visible()
    # No receipt number anywhere (the steps still to come name the receipt address only as the
    # pattern the payment step expects).
    assert not re.search(r"RCPT-[0-9]{4}-[0-9]{6}", page.content())

    # A reviewer, in a browser of their own, decides from the queue while looking at the evidence.
    reviewer_context = browser.new_context()
    try:
        reviewer = reviewer_context.new_page()
        log_in(reviewer, stack, Role.REVIEWERS)
        reviewer.get_by_role("navigation", name="Main").get_by_role(
            "link", name="Approvals"
        ).click()
        # This run's request: the queue may hold other runs' requests too (another test's, left
        # waiting on the same installation).
        # The queue names the page by its host; the reference fact names the invoice.
        host = urlsplit(stack.portal_url).netloc
        reviewer.get_by_role("row").filter(has_text="Pay an Acme invoice v1").filter(
            has_text=invoice.number
        ).get_by_role("link", name=f"Click the button 'Submit payment' on {host}").click()
        expect(reviewer.get_by_role("heading", level=1)).to_contain_text(
            f"Click the button 'Submit payment' on {host}"
        )
        expect(reviewer.get_by_text(f"{invoice.amount_due:.2f}").first).to_be_visible()
        reviewer.get_by_role("button", name="Approve this action").click()
        expect(reviewer.locator("body")).to_contain_text("Approved", timeout=30_000)
    except Exception:
        # Shown by pytest with the failure: what the reviewer saw, and the stack's own output.
        print(reviewer.url, reviewer.locator("main").inner_text()[:3000], stack.log_tail(2000))
        raise
    finally:
        reviewer_context.close()

    # The operator's page follows the run to its end, live; the portal recorded one payment.
    expect(header).to_contain_text("Succeeded", timeout=120_000)
    expect(timeline).to_have_count(17, timeout=30_000)
    # No proxy from the environment: this request is for the loopback portal only.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{stack.portal_url.rstrip('/')}/api/payments", timeout=10) as answer:
        payments = json.load(answer)
    assert [p["invoice"] for p in payments] == [invoice.number]

    page.locator("#step-0 .thumb").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Step 1: Go to")
    expect(page.locator("pre.observation")).to_contain_text('textbox "Username"')
