"""Refusals as portals commonly show them, read from real pages in Chromium (not only the demo
portal's markup)."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page

from sessions.outcomes import visible_refusals

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
