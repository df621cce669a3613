"""Refusals as portals commonly show them, read from real pages in Chromium (not only the demo
portal's markup), and the failed answers to a page's submissions."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page

from pandaweb.demo_portal.server import PortalServer
from sessions.engine.outcomes import ResponseWatch, visible_refusals
from tests.demo_portal.conftest import fetch_json, sign_in

pytestmark = pytest.mark.browser


@pytest.mark.parametrize(
    ("html", "expected"),
    [
        # Bootstrap puts role=alert on every alert: only the error one is a refusal.
        ('<div class="alert alert-danger" role="alert">Card declined.</div>', ["Card declined."]),
        ('<div class="alert alert-success" role="alert">Payment sent.</div>', []),
        ('<div class="alert alert-info" role="alert">Cut-off is 16:00.</div>', []),
        # A flash message that only its class marks as an error.
        (
            '<p class="flash flash-error">Session expired, nothing was saved.</p>',
            ["Session expired, nothing was saved."],
        ),
        ('<ul class="errorlist"><li>IBAN is not valid.</li></ul>', ["IBAN is not valid."]),
        ('<label>IBAN <span class="text-danger">*</span></label>', []),
        ('<ul class="errors"><li>IBAN is not valid.</li></ul>', ["IBAN is not valid."]),
        (
            '<div aria-live="assertive">Transfer rejected by the bank.</div>',
            ["Transfer rejected by the bank."],
        ),
        # A field marked invalid, with the message it points to.
        (
            '<label for="iban">IBAN</label><input id="iban" aria-invalid="true" '
            'aria-describedby="iban-hint"><small id="iban-hint">Check digits do not match.</small>',
            ["IBAN: Check digits do not match."],
        ),
        (
            '<label for="iban">IBAN</label><input id="iban" aria-invalid="true" '
            'aria-describedby="iban-error"><div class="error" id="iban-error">Not an IBAN.</div>',
            ["IBAN: Not an IBAN."],
        ),
        # Hidden, empty or confirmation dialogs are not refusals.
        ('<div role="alert" hidden>Old error</div>', []),
        ('<div role="alert" style="display:none">Old error</div>', []),
        ('<div role="alert"></div>', []),
        ('<div role="alertdialog"><p>Really pay?</p><button>OK</button></div>', []),
        # Controls in a warning colour are things to press, not messages: a row menu's red
        # "Cancel order", a red link or button, and the wrapper around one.
        (
            '<div role="menu"><div role="menuitem" class="menu-item">View order</div>'
            '<div role="menuitem" class="menu-item menu-item-danger">Cancel order</div></div>',
            [],
        ),
        ('<a class="link-danger" href="/orders/1/cancel">Cancel order</a>', []),
        ('<span class="text-danger" role="button" tabindex="0">Delete account</span>', []),
        ('<li class="dropdown-item-danger"><a href="#">Delete supplier</a></li>', []),
        ('<div role="tablist"><span role="tab" class="tab-error">Payments (2)</span></div>', []),
        # An alert's own words, without the button that dismisses it.
        (
            '<div class="alert alert-danger" role="alert">Card declined. '
            '<button type="button">Dismiss</button></div>',
            ["Card declined."],
        ),
        # Nested error markup is one message, not two.
        (
            '<div class="error-summary" role="alert"><h2>There is a problem</h2>'
            '<p class="error">Amount exceeds the amount due.</p></div>',
            ["There is a problem Amount exceeds the amount due."],
        ),
    ],
)
def test_it_reads_refusals_the_way_portals_show_them(
    page: Page, html: str, expected: list[str]
) -> None:
    page.set_content(f"<!doctype html><main>{html}</main>")

    assert visible_refusals(page) == expected


def test_it_counts_a_4xx_answer_with_the_portal_s_words_as_a_refusal(
    page: Page, portal: str
) -> None:
    sign_in(page, portal)
    fetch_json(f"{portal}/api/lab/approvals/INV-1036", method="POST")
    page.goto(f"{portal}/lab/approval-request/INV-1036")

    with ResponseWatch(page.context) as watch, page.expect_response("**/lab/api/approvals/*"):
        page.get_by_role("button", name="Approve INV-1036").click()

    [failure] = watch.failed
    assert failure.is_refusal
    assert watch.unanswered == []
    assert failure.describe().startswith(
        f"HTTP 409 to POST {portal}/lab/api/approvals/INV-1036: This invoice was already approved"
    )


def test_it_counts_a_submission_that_got_no_answer_as_unanswered_not_refused(
    page: Page, portal: str, portal_server: PortalServer
) -> None:
    sign_in(page, portal)
    page.goto(f"{portal}/lab/approval-request/INV-1035")
    portal_server.dropped_paths = {r"^/lab/api/approvals/"}

    with ResponseWatch(page.context) as watch, page.expect_event("requestfailed"):
        page.get_by_role("button", name="Approve INV-1035").click()

    [failure] = watch.failed
    assert not failure.is_refusal
    assert failure.status == 0
    assert failure.network_error.startswith("net::ERR_")
    assert failure.describe() == (
        f"POST {portal}/lab/api/approvals/INV-1035 got no answer ({failure.network_error})"
    )
    # The portal acted all the same: only its answer was lost.
    assert [a["invoice"] for a in fetch_json(f"{portal}/api/lab")["approvals"]] == ["INV-1035"]


def test_it_counts_a_server_error_as_unanswered_whatever_its_page_says(
    page: Page, portal: str
) -> None:
    sign_in(page, portal)
    page.goto(f"{portal}/lab/transfer")

    with ResponseWatch(page.context) as watch, page.expect_response("**/lab/transfer"):
        page.get_by_role("button", name="Send transfer").click()

    [failure] = watch.failed
    assert (failure.status, failure.is_refusal, failure.by_proxy) == (503, False, False)
    assert watch.unanswered == [failure]


def test_it_leaves_out_what_the_page_sends_to_other_sites(page: Page, portal: str) -> None:
    sign_in(page, portal)
    page.goto(f"{portal}/lab/approvals/INV-1040")
    # A tracker on another site, which the egress proxy would cut off, fails as a network error.
    tracker = portal.replace("127.0.0.1", "127.0.0.9") + "/collect"

    with ResponseWatch(page.context) as watch:
        with page.expect_event("requestfailed"):
            page.evaluate(
                "url => fetch(url, {method: 'POST', mode: 'no-cors', body: 'x'}).catch(() => {})",
                tracker,
            )
        with page.expect_response("**/lab/approvals/INV-1040"):
            page.get_by_role("button", name="Approve invoice").click()

    assert watch.failed == []
