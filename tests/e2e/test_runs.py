from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from pandaweb.core.roles import Role
from pandaweb.demo_portal.state import PortalState
from tests.e2e.conftest import Stack
from tests.e2e.test_dashboard import log_in

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


def test_the_demo_workflow_runs_live_and_stops_before_paying(page: Page, stack: Stack) -> None:
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
    assert "RCPT-" not in page.content()

    page.locator("#step-0 .thumb").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Step 1: Go to")
    expect(page.locator("pre.observation")).to_contain_text('textbox "Username"')
