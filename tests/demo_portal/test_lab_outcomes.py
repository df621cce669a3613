"""The lab pages where the portal says no, and the one that asks with a native confirm()."""

from __future__ import annotations

import pytest
from playwright.sync_api import Dialog, Page, expect

from tests.demo_portal.conftest import fetch_json, sign_in

pytestmark = pytest.mark.browser


def test_an_invoice_is_approved_once(page: Page, portal: str) -> None:
    sign_in(page, portal)
    page.goto(f"{portal}/lab/approvals/INV-1040")

    page.get_by_role("button", name="Approve invoice").click()

    expect(page.get_by_role("status")).to_contain_text("Invoice INV-1040 approved for payment")
    expect(page.get_by_role("alert")).to_have_count(0)
    approvals = fetch_json(f"{portal}/api/lab")["approvals"]
    assert [(a["invoice"], a["by"]) for a in approvals] == [("INV-1040", "acme-demo")]


def test_a_second_approval_from_a_stale_page_is_refused_in_an_alert(
    page: Page, portal: str
) -> None:
    sign_in(page, portal)
    page.goto(f"{portal}/lab/approvals/INV-1039")
    # A colleague approves while this page is open.
    fetch_json(f"{portal}/api/lab/approvals/INV-1039", method="POST")

    page.get_by_role("button", name="Approve invoice").click()

    expect(page.get_by_role("alert")).to_contain_text(
        "This invoice was already approved by colleague on"
    )
    expect(page.get_by_role("alert")).to_contain_text("no second approval was recorded")
    approvals = fetch_json(f"{portal}/api/lab")["approvals"]
    assert [(a["invoice"], a["by"]) for a in approvals] == [("INV-1039", "colleague")]


def test_the_approval_request_page_shows_a_refusal_from_its_script(page: Page, portal: str) -> None:
    sign_in(page, portal)
    fetch_json(f"{portal}/api/lab/approvals/INV-1036", method="POST")
    page.goto(f"{portal}/lab/approval-request/INV-1036")

    with page.expect_response(f"{portal}/lab/api/approvals/INV-1036") as answer:
        page.get_by_role("button", name="Approve INV-1036").click()

    assert answer.value.status == 409
    expect(page.get_by_role("alert")).to_contain_text(
        "This invoice was already approved by colleague on"
    )


def test_the_transfer_is_answered_with_http_503(page: Page, portal: str) -> None:
    sign_in(page, portal)
    page.goto(f"{portal}/lab/transfer")

    with page.expect_response(f"{portal}/lab/transfer") as answer:
        page.get_by_role("button", name="Send transfer").click()

    assert answer.value.status == 503
    expect(page.get_by_role("heading", name="Payment service unavailable")).to_be_visible()


@pytest.mark.parametrize(("accept", "removed"), [(True, ["Northwind Traders"]), (False, [])])
def test_removing_the_supplier_asks_with_a_confirm_first(
    page: Page, portal: str, accept: bool, removed: list[str]
) -> None:
    sign_in(page, portal)
    page.goto(f"{portal}/lab/supplier")
    seen: list[str] = []

    def answer(dialog: Dialog) -> None:
        seen.append(f"{dialog.type}: {dialog.message}")
        dialog.accept() if accept else dialog.dismiss()

    page.on("dialog", answer)
    page.get_by_role("button", name="Remove supplier").click()

    if accept:
        expect(page.get_by_role("status")).to_contain_text("Northwind Traders was removed")
    assert seen == [
        "confirm: Remove supplier Northwind Traders? Open invoices stay, but no new orders can "
        "be placed. This cannot be undone."
    ]
    assert fetch_json(f"{portal}/api/lab")["removed_suppliers"] == removed


def test_an_order_s_row_menu_offers_a_red_cancel_that_the_portal_refuses(
    page: Page, portal: str
) -> None:
    sign_in(page, portal)
    page.goto(f"{portal}/lab/orders")
    cancel = page.get_by_role("menuitem", name="Cancel order")
    expect(cancel).to_be_hidden()

    page.get_by_role("button", name="Actions for PO-2026-0415").click()
    expect(cancel).to_have_css("color", "rgb(198, 40, 40)")
    cancel.click()

    expect(page.get_by_role("alert")).to_have_text(
        "Order PO-2026-0415 was delivered on 14 November 2026; it can no longer be cancelled."
    )
