from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Page, Route, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from pandaweb.demo_portal.lab import INJECTED_INSTRUCTION
from pandaweb.demo_portal.pages import LAB_PAGES
from tests.demo_portal.conftest import fetch_json, sign_in

pytestmark = pytest.mark.browser


def test_the_dashboard_links_every_lab_page(page: Page, portal: str) -> None:
    sign_in(page, portal)
    lab = page.locator("#lab")
    for href, label, _ in LAB_PAGES:
        expect(lab.get_by_role("link", name=label)).to_have_attribute("href", href)


def test_the_cookie_banner_shows_until_accepted(page: Page, portal: str) -> None:
    sign_in(page, portal, accept_cookies=False)
    banner = page.get_by_role("region", name="Cookie consent")
    expect(banner).to_contain_text("We use cookies")
    page.goto(f"{portal}/invoices?page=2")
    expect(banner).to_be_visible()
    # The banner sits over the page: what is under it cannot be clicked.
    assert banner.evaluate("element => getComputedStyle(element).position") == "fixed"

    banner.get_by_role("button", name="Accept").click()

    expect(banner).to_be_hidden()
    assert page.url == f"{portal}/invoices?page=2"
    page.reload()
    page.goto(f"{portal}/")
    expect(banner).to_be_hidden()
    consent = {c["name"]: c["value"] for c in page.context.cookies()}["acme_cookies"]
    assert consent == "accepted"


def test_rejecting_cookies_also_hides_the_banner(page: Page, portal: str) -> None:
    sign_in(page, portal, accept_cookies=False)
    page.get_by_role("button", name="Reject").click()

    page.goto(f"{portal}/invoices")
    expect(page.get_by_text("We use cookies")).to_be_hidden()
    consent = {c["name"]: c["value"] for c in page.context.cookies()}["acme_cookies"]
    assert consent == "rejected"


def test_late_content_appears_after_a_delay(page: Page, portal: str) -> None:
    sign_in(page, portal)
    page.goto(f"{portal}/lab/late-content")
    export = page.get_by_role("button", name="Export statistics")
    expect(export).to_have_count(0)

    expect(export).to_be_visible()
    expect(page.locator("#delivery-statistics tbody tr")).to_have_count(3)
    export.click()
    expect(page.get_by_text("Export ready")).to_be_visible()


def test_the_modal_must_be_closed_before_the_page_works(page: Page, portal: str) -> None:
    sign_in(page, portal)
    page.goto(f"{portal}/lab/modal")
    confirm = page.get_by_role("button", name="Confirm delivery")

    with pytest.raises(PlaywrightTimeoutError, match="intercepts pointer events"):
        confirm.click(timeout=1500)
    expect(page.locator("#confirm-result")).to_have_text("")

    page.get_by_role("dialog", name="Planned maintenance").get_by_role(
        "button", name="Close"
    ).click()
    confirm.click()
    expect(page.locator("#confirm-result")).to_have_text("Delivery confirmed")


def test_the_iframe_form_can_be_filled(page: Page, portal: str) -> None:
    sign_in(page, portal)
    page.goto(f"{portal}/lab/iframe")
    frame = page.frame_locator('iframe[title="Supplier details form"]')

    frame.get_by_label("Supplier reference").fill("SUP-4711")
    frame.get_by_role("button", name="Save").click()

    expect(frame.get_by_role("status")).to_have_text("Saved")
    expect(page.get_by_label("Supplier reference")).to_have_count(0)


def test_the_shadow_dom_widget_works_with_normal_locators(page: Page, portal: str) -> None:
    sign_in(page, portal)
    page.goto(f"{portal}/lab/shadow")

    page.get_by_label("Discount code").fill("WINTER26")
    page.get_by_role("button", name="Apply code").click()

    expect(page.get_by_text("Code WINTER26 applied")).to_be_visible()
    assert page.evaluate("document.querySelector('#code') === null")
    assert page.evaluate("document.querySelector('acme-widget').shadowRoot !== null")


def test_the_custom_dropdown_chooses_an_option(page: Page, portal: str) -> None:
    sign_in(page, portal)
    page.goto(f"{portal}/lab/dropdown")
    combobox = page.get_by_role("combobox", name="Shipping method")
    expect(page.get_by_role("listbox")).to_be_hidden()

    combobox.click()
    expect(combobox).to_have_attribute("aria-expanded", "true")
    page.get_by_role("option", name="Express").click()

    expect(combobox).to_have_text("Express")
    expect(combobox).to_have_attribute("aria-expanded", "false")
    expect(page.get_by_role("listbox")).to_be_hidden()
    expect(page.locator("#shipping-result")).to_have_text("Shipping method: Express")


def test_the_custom_dropdown_works_with_the_keyboard(page: Page, portal: str) -> None:
    sign_in(page, portal)
    page.goto(f"{portal}/lab/dropdown")
    page.get_by_role("combobox", name="Shipping method").focus()

    for key in ("ArrowDown", "ArrowDown", "ArrowDown", "Enter"):
        page.keyboard.press(key)

    expect(page.locator("#shipping-result")).to_have_text("Shipping method: Pickup")


def test_the_injection_page_is_only_text(page: Page, portal: str) -> None:
    sign_in(page, portal)
    page.goto(f"{portal}/lab/injection")

    expect(page.get_by_text(INJECTED_INSTRUCTION)).to_be_visible()
    expect(page.locator("main").locator("form, input, button")).to_have_count(0)
    assert fetch_json(f"{portal}/api/payments") == []


def test_the_external_page_tries_to_reach_other_hosts(page: Page, portal: str) -> None:
    port = urlsplit(portal).port
    requested: list[str] = []
    blocked: list[str] = []

    def only_the_portal(route: Route) -> None:
        if route.request.url.startswith(f"{portal}/"):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort("blockedbyclient")

    # Routed before anything loads, so no request ever leaves for another host.
    page.route("**/*", only_the_portal)
    page.on("request", lambda request: requested.append(request.url))
    sign_in(page, portal)
    page.goto(f"{portal}/lab/external", wait_until="load")

    expect(page.get_by_role("heading", name="Partner offers")).to_be_visible()
    disallowed = {
        "http://tracker.evil.test/t.js",
        "http://cdn.acme.invalid/logo.png",
        f"http://127.0.0.9:{port}/pixel.png",
    }
    assert set(blocked) == disallowed
    assert disallowed <= set(requested)


def test_the_consent_dialog_swallows_clicks_until_answered(page: Page, portal: str) -> None:
    sign_in(page, portal)
    page.goto(f"{portal}/lab/consent")
    send = page.get_by_role("button", name="Continue")

    with pytest.raises(PlaywrightTimeoutError, match="intercepts pointer events"):
        send.click(timeout=1500)
    expect(page.locator("#continue-result")).to_have_text("")

    page.get_by_role("dialog", name="We value your privacy").get_by_role(
        "button", name="Reject all"
    ).click()
    send.click()
    expect(page.locator("#continue-result")).to_have_text("Order PO-2026-0502 sent for delivery")


def test_the_payout_account_changes_only_with_the_code_sent_by_sms(page: Page, portal: str) -> None:
    sign_in(page, portal)
    page.goto(f"{portal}/lab/sms")
    assert fetch_json(f"{portal}/api/last-code")["code"] is None
    page.get_by_role("button", name="Text me a code").click()
    expect(page.get_by_role("status")).to_contain_text("We sent a six-digit code to +49 151")
    sms = fetch_json(f"{portal}/api/last-code")
    field = page.get_by_label("SMS code")
    assert field.get_attribute("autocomplete") == "one-time-code"

    field.fill(f"{(int(sms['code']) + 1) % 1_000_000:06d}")
    page.get_by_role("button", name="Save new account").click()
    expect(page.get_by_role("alert")).to_contain_text("The code is wrong or was already used")
    assert fetch_json(f"{portal}/api/lab")["sms_confirmations"] == []

    page.get_by_role("button", name="Text me a code").click()
    fresh = fetch_json(f"{portal}/api/last-code")["code"]
    page.get_by_label("SMS code").fill(fresh)
    page.get_by_role("button", name="Save new account").click()
    expect(page.get_by_role("status")).to_contain_text("Payout account changed")
    assert len(fetch_json(f"{portal}/api/lab")["sms_confirmations"]) == 1
    assert fetch_json(f"{portal}/api/last-code")["code"] is None  # a code confirms once
