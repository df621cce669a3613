from __future__ import annotations

from decimal import Decimal

import pytest

from pandaweb.demo_portal.forms import validate_payment
from pandaweb.demo_portal.state import (
    DEMO_PASSWORD,
    DEMO_USERNAME,
    PAYEE_IBAN,
    PaymentError,
    PortalState,
)


def test_it_starts_with_deterministic_invoices() -> None:
    first, second = PortalState().invoices(), PortalState().invoices()
    assert first == second
    assert len(first) >= 36
    assert len({invoice.month for invoice in first}) >= 4
    assert {invoice.status for invoice in first} == {"open", "paid"}
    assert all(invoice.amount > 0 and invoice.currency == "EUR" for invoice in first)
    assert first[-1].number == "INV-1001"


def test_it_authenticates_only_the_demo_login() -> None:
    state = PortalState()
    assert state.authenticate(DEMO_USERNAME, DEMO_PASSWORD) is not None
    assert state.authenticate(DEMO_USERNAME, "wrong") is None
    assert state.authenticate("someone-else", DEMO_PASSWORD) is None


def test_it_records_a_draft_only_once() -> None:
    state = PortalState()
    invoice = state.invoices()[0]
    draft = state.create_draft(DEMO_USERNAME, invoice.number, Decimal("10.00"), PAYEE_IBAN, "x")

    first = state.submit_draft(draft.token, DEMO_USERNAME, invoice.number)
    again = state.submit_draft(draft.token, DEMO_USERNAME, invoice.number)

    assert first == again
    assert first.receipt == "RCPT-2026-000001"
    assert state.payments() == [first]
    updated = state.invoice(invoice.number)
    assert updated is not None
    assert updated.amount_due == invoice.amount_due - Decimal("10.00")


def test_it_refuses_a_draft_for_another_invoice_or_user() -> None:
    state = PortalState()
    invoice = state.invoices()[0]
    draft = state.create_draft(DEMO_USERNAME, invoice.number, Decimal("1.00"), PAYEE_IBAN, "x")
    with pytest.raises(PaymentError):
        state.submit_draft(draft.token, DEMO_USERNAME, "INV-1001")
    with pytest.raises(PaymentError):
        state.submit_draft(draft.token, "intruder", invoice.number)
    with pytest.raises(PaymentError):
        state.submit_draft("not-a-token", DEMO_USERNAME, invoice.number)
    assert state.payments() == []


def test_it_refuses_to_overpay_an_invoice_paid_meanwhile() -> None:
    state = PortalState()
    invoice = state.invoices()[0]
    drafts = [
        state.create_draft(DEMO_USERNAME, invoice.number, invoice.amount_due, PAYEE_IBAN, "x")
        for _ in range(2)
    ]
    state.submit_draft(drafts[0].token, DEMO_USERNAME, invoice.number)
    with pytest.raises(PaymentError, match="Nothing was paid"):
        state.submit_draft(drafts[1].token, DEMO_USERNAME, invoice.number)
    assert len(state.payments()) == 1


def test_reset_restores_the_initial_state() -> None:
    state = PortalState()
    initial = state.invoices()
    token = state.open_session(DEMO_USERNAME)
    invoice = initial[0]
    draft = state.create_draft(DEMO_USERNAME, invoice.number, invoice.amount_due, PAYEE_IBAN, "x")
    state.submit_draft(draft.token, DEMO_USERNAME, invoice.number)

    state.reset()

    assert state.invoices() == initial
    assert state.payments() == []
    assert state.session_user(token) is None
    with pytest.raises(PaymentError):
        state.submit_draft(draft.token, DEMO_USERNAME, invoice.number)


def test_the_payment_form_reports_each_invalid_field() -> None:
    details, errors = validate_payment(
        {"amount": "12.345", "iban": "DE00 1234", "reference": ""}, Decimal("100.00"), "EUR"
    )
    assert details is None
    assert set(errors) == {"amount", "iban", "reference"}

    _, errors = validate_payment(
        {"amount": "100.01", "iban": PAYEE_IBAN, "reference": "INV-1040"}, Decimal("100.00"), "EUR"
    )
    assert errors == {"amount": "The amount cannot be more than the EUR 100.00 due."}

    _, errors = validate_payment(
        {"amount": "0", "iban": PAYEE_IBAN, "reference": "INV-1040"}, Decimal("100.00"), "EUR"
    )
    assert set(errors) == {"amount"}


def test_the_payment_form_cleans_valid_input() -> None:
    details, errors = validate_payment(
        {"amount": " 99.5 ", "iban": "de97 2004 0060 0123 4567 89", "reference": " INV-1040 "},
        Decimal("100.00"),
        "EUR",
    )
    assert errors == {}
    assert details is not None
    assert details.amount == Decimal("99.50")
    assert str(details.amount) == "99.50"
    assert details.iban == PAYEE_IBAN
    assert details.reference == "INV-1040"


def test_signing_everybody_out_keeps_the_invoices() -> None:
    state = PortalState()
    tokens = [state.open_session(DEMO_USERNAME) for _ in range(2)]
    invoices = state.invoices()

    assert state.close_all_sessions() == 2

    assert [state.session_user(token) for token in tokens] == [None, None]
    assert state.invoices() == invoices
    assert state.close_all_sessions() == 0
