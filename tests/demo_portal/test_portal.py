from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.demo_portal.conftest import fetch_json, sign_in

pytestmark = pytest.mark.browser

PAYEE_IBAN = "DE97 2004 0060 0123 4567 89"
DASH = "\N{EN DASH}"


def invoice_numbers(page: Page) -> list[str]:
    return page.locator("tbody tr td:first-child").all_inner_texts()


def review_payment(page: Page, portal: str, number: str, *, iban: str, amount: str = "") -> None:
    page.goto(f"{portal}/invoices/{number}")
    page.get_by_role("link", name="Pay invoice").click()
    expect(page.get_by_role("heading", name=f"Pay invoice {number}")).to_be_visible()
    if amount:
        page.get_by_label("Amount (EUR)").fill(amount)
    page.get_by_label("IBAN").fill(iban)
    page.get_by_role("button", name="Review payment").click()


def test_it_signs_in_with_the_demo_login(page: Page, portal: str) -> None:
    sign_in(page, portal)

    assert page.url == f"{portal}/"
    session = next(c for c in page.context.cookies() if c["name"] == "acme_session")
    assert session["httpOnly"]
    expect(page.get_by_role("heading", name="Acme Supplier Portal")).to_have_count(0)
    expect(page.get_by_role("link", name="Acme Supplier Portal")).to_be_visible()
    expect(page.get_by_test_id("open-invoices")).to_have_text("25")


def test_it_rejects_a_wrong_password(page: Page, portal: str) -> None:
    page.goto(f"{portal}/login")
    page.get_by_label("Username").fill("acme-demo")
    page.get_by_label("Password").fill("not-the-password")
    page.get_by_role("button", name="Sign in").click()

    expect(page.get_by_role("alert")).to_have_text("Invalid username or password")
    expect(page.get_by_label("Username")).to_have_value("acme-demo")
    assert all(c["name"] != "acme_session" for c in page.context.cookies())
    page.goto(f"{portal}/invoices")
    assert page.url.startswith(f"{portal}/login?next=")


def test_it_returns_to_the_requested_page_after_signing_in(page: Page, portal: str) -> None:
    page.goto(f"{portal}/invoices?page=2")
    assert page.url == f"{portal}/login?next=/invoices%3Fpage%3D2"
    page.get_by_label("Username").fill("acme-demo")
    page.get_by_label("Password").fill("portal-demo-2026")
    page.get_by_role("button", name="Sign in").click()

    expect(page.get_by_test_id("summary")).to_contain_text(f"Showing 11{DASH}20 of 40")


def test_it_signs_out(page: Page, portal: str) -> None:
    sign_in(page, portal)
    page.get_by_role("button", name="Log out").click()

    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.goto(f"{portal}/")
    assert page.url.startswith(f"{portal}/login")


def test_it_paginates_the_invoices(page: Page, portal: str) -> None:
    sign_in(page, portal)
    page.get_by_role("link", name="Invoices", exact=True).click()
    expect(page.get_by_test_id("summary")).to_contain_text(f"Showing 1{DASH}10 of 40 invoices")
    first_page = invoice_numbers(page)

    page.get_by_role("navigation", name="Pagination").get_by_role("link", name="Next").click()

    expect(page.get_by_test_id("summary")).to_contain_text(f"Showing 11{DASH}20 of 40 invoices")
    second_page = invoice_numbers(page)
    assert len(first_page) == len(second_page) == 10
    assert not set(first_page) & set(second_page)
    page.get_by_role("link", name="Page 4").click()
    expect(page.get_by_test_id("summary")).to_contain_text(f"Showing 31{DASH}40 of 40 invoices")
    assert invoice_numbers(page)[-1] == "INV-1001"
    page.get_by_role("link", name="Previous").click()
    expect(page.get_by_test_id("summary")).to_contain_text(f"Showing 21{DASH}30 of 40 invoices")


def test_it_filters_the_invoices_by_month(page: Page, portal: str) -> None:
    sign_in(page, portal)
    page.goto(f"{portal}/invoices")

    page.get_by_label("Month").select_option("2026-09")
    page.get_by_role("button", name="Filter").click()

    expect(page.get_by_test_id("summary")).to_contain_text(
        f"Showing 1{DASH}9 of 9 invoices in September 2026"
    )
    assert "month=2026-09" in page.url
    issued = page.locator("tbody tr td:nth-child(2)").all_inner_texts()
    assert len(issued) == 9
    assert all(text.endswith("Sep 2026") for text in issued)
    expect(page.get_by_label("Month")).to_have_value("2026-09")


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("month=2026-13", "“2026-13” is not a month"),
        ("month=September", "“September” is not a month"),
        ("page=zwei", "“zwei” is not a page number"),
        ("page=0", "“0” is not a page number"),
        ("page=9", "Page 9 does not exist: there are 4 pages."),
        ("month=2026-09&page=2", "Page 2 does not exist: there is 1 page."),
    ],
)
def test_it_explains_bad_invoice_list_parameters(
    page: Page, portal: str, query: str, message: str
) -> None:
    sign_in(page, portal)
    response = page.goto(f"{portal}/invoices?{query}")

    assert response is not None
    assert response.status == 400
    expect(page.get_by_role("alert")).to_contain_text(message)
    expect(page.get_by_role("link", name="Show all invoices")).to_be_visible()


def test_it_shows_a_404_page_for_an_unknown_invoice(page: Page, portal: str) -> None:
    sign_in(page, portal)
    response = page.goto(f"{portal}/invoices/INV-9999")

    assert response is not None
    assert response.status == 404
    expect(page.get_by_role("heading", name="Page not found")).to_be_visible()


def test_it_downloads_an_invoice_as_csv(page: Page, portal: str) -> None:
    sign_in(page, portal)
    page.goto(f"{portal}/invoices")
    page.get_by_role("link", name="INV-1035").click()
    expect(page.get_by_role("heading", name="Invoice INV-1035")).to_be_visible()

    with page.expect_download() as download_info:
        page.get_by_role("link", name="Download CSV").click()

    download = download_info.value
    assert download.suggested_filename == "INV-1035.csv"
    rows = list(csv.DictReader(io.StringIO(Path(download.path()).read_text())))
    assert rows
    assert {row["Invoice number"] for row in rows} == {"INV-1035"}
    assert {row["Currency"] for row in rows} == {"EUR"}
    total = sum(float(row["Line total"]) for row in rows)
    expect(page.get_by_test_id("amount-due")).to_have_text(f"EUR {total:,.2f}")


def test_a_payment_is_submitted_exactly_once(page: Page, portal: str) -> None:
    sign_in(page, portal)
    page.goto(f"{portal}/invoices/INV-1040")
    amount_due = page.get_by_test_id("amount-due").inner_text().removeprefix("EUR ")
    page.get_by_role("link", name="Pay invoice").click()
    expect(page.get_by_label("Amount (EUR)")).to_have_value(amount_due.replace(",", ""))
    expect(page.get_by_label("Payment reference")).to_have_value("INV-1040")
    page.get_by_label("IBAN").fill(PAYEE_IBAN.lower())
    page.get_by_role("button", name="Review payment").click()

    expect(page.get_by_role("heading", name="Review payment")).to_be_visible()
    expect(page.get_by_test_id("confirm-iban")).to_have_text(PAYEE_IBAN)
    assert fetch_json(f"{portal}/api/payments") == []
    token = page.locator("input[name=token]").input_value()
    page.get_by_role("button", name="Submit payment").dblclick()

    expect(page.get_by_test_id("receipt")).to_have_text("RCPT-2026-000001")
    payments = fetch_json(f"{portal}/api/payments")
    assert len(payments) == 1
    assert payments[0]["receipt"] == "RCPT-2026-000001"
    assert payments[0]["invoice"] == "INV-1040"
    assert payments[0]["amount"] == amount_due.replace(",", "")
    assert payments[0]["currency"] == "EUR"
    assert payments[0]["iban"] == PAYEE_IBAN.replace(" ", "")
    assert payments[0]["reference"] == "INV-1040"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+\+00:00", payments[0]["created_at"])

    # The same form posted again (a resubmission) shows the same receipt and pays nothing more.
    again = page.request.post(f"{portal}/invoices/INV-1040/pay/submit", form={"token": token})
    assert again.ok
    assert again.url == f"{portal}/receipts/RCPT-2026-000001"
    assert len(fetch_json(f"{portal}/api/payments")) == 1

    page.goto(f"{portal}/invoices/INV-1040")
    expect(page.locator("h1 .badge")).to_have_text("Paid")
    expect(page.get_by_role("link", name="Pay invoice")).to_have_count(0)


def test_a_partial_payment_leaves_the_rest_due(page: Page, portal: str) -> None:
    sign_in(page, portal)
    review_payment(page, portal, "INV-1039", iban=PAYEE_IBAN, amount="10.5")
    expect(page.get_by_test_id("confirm-amount")).to_have_text("EUR 10.50")
    page.get_by_role("button", name="Submit payment").click()
    expect(page.get_by_test_id("receipt")).to_be_visible()

    assert [p["amount"] for p in fetch_json(f"{portal}/api/payments")] == ["10.50"]
    page.goto(f"{portal}/invoices/INV-1039")
    expect(page.locator("h1 .badge")).to_have_text("Open")


def test_it_rejects_a_bad_iban(page: Page, portal: str) -> None:
    sign_in(page, portal)
    review_payment(page, portal, "INV-1040", iban="DE97 2004 0060 0123 4567 88")

    expect(page.get_by_role("alert")).to_have_text("Please correct the errors below.")
    expect(page.locator("#iban-error")).to_have_text("This IBAN is not valid. Check it for typos.")
    expect(page.get_by_label("IBAN")).to_have_attribute("aria-invalid", "true")
    expect(page.get_by_label("IBAN")).to_have_value("DE97 2004 0060 0123 4567 88")
    expect(page.get_by_role("button", name="Submit payment")).to_have_count(0)
    assert fetch_json(f"{portal}/api/payments") == []


def test_it_rejects_more_than_the_amount_due(page: Page, portal: str) -> None:
    sign_in(page, portal)
    review_payment(page, portal, "INV-1040", iban=PAYEE_IBAN, amount="999999")

    expect(page.locator("#amount-error")).to_contain_text("cannot be more than")
    expect(page.locator("#iban-error")).to_have_count(0)


def test_reset_forgets_payments(page: Page, portal: str) -> None:
    sign_in(page, portal)
    review_payment(page, portal, "INV-1038", iban=PAYEE_IBAN)
    page.get_by_role("button", name="Submit payment").click()
    expect(page.get_by_test_id("receipt")).to_be_visible()
    assert len(fetch_json(f"{portal}/api/payments")) == 1

    assert fetch_json(f"{portal}/api/reset", method="POST") == {"ok": True}

    assert fetch_json(f"{portal}/api/payments") == []
    page.goto(f"{portal}/invoices/INV-1038")
    assert page.url.startswith(f"{portal}/login")  # sessions are part of the state


def test_a_repriced_payment_shows_its_new_amount_on_the_open_review_page(
    page: Page, portal: str
) -> None:
    sign_in(page, portal)
    page.goto(f"{portal}/invoices/INV-1040/pay")
    page.get_by_label("IBAN").fill(PAYEE_IBAN)
    page.get_by_role("button", name="Review payment").click()
    expect(page.get_by_role("heading", name="Review payment")).to_be_visible()

    changed = page.request.post(
        f"{portal}/api/drafts/reprice", form={"invoice": "INV-1040", "amount": "12.34"}
    )

    assert changed.json() == {"changed": 1}
    expect(page.get_by_test_id("confirm-amount")).to_have_text("EUR 12.34", timeout=5_000)
    page.get_by_role("button", name="Submit payment").click()
    expect(page.get_by_test_id("receipt")).to_be_visible()
    assert fetch_json(f"{portal}/api/payments")[0]["amount"] == "12.34"
