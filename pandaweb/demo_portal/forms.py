"""Validation of the payment form, with one message per field as the portal shows them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from pandaweb.demo_portal.iban import is_valid_iban, normalize_iban
from pandaweb.demo_portal.state import ZERO

_AMOUNT = re.compile(r"[0-9]{1,9}(\.[0-9]{1,2})?")
# The SEPA character set: banks reject anything else in a remittance reference.
_REFERENCE = re.compile(r"[A-Za-z0-9/?:().,'+ -]{1,35}")


@dataclass(frozen=True)
class PaymentDetails:
    amount: Decimal
    iban: str
    reference: str


def validate_payment(
    form: Mapping[str, str], amount_due: Decimal, currency: str
) -> tuple[PaymentDetails | None, dict[str, str]]:
    """The cleaned details, or None and the error message of each invalid field."""
    errors: dict[str, str] = {}

    amount_text = form.get("amount", "").strip()
    amount = ZERO
    if not amount_text:
        errors["amount"] = "Enter the amount to pay."
    elif not _AMOUNT.fullmatch(amount_text):
        errors["amount"] = "Enter the amount as a number with at most two decimals, e.g. 1250.00."
    else:
        amount = Decimal(amount_text).quantize(Decimal("0.01"))
        if amount <= ZERO:
            errors["amount"] = "The amount must be more than 0.00."
        elif amount > amount_due:
            errors["amount"] = (
                f"The amount cannot be more than the {currency} {amount_due:,.2f} due."
            )

    iban = normalize_iban(form.get("iban", ""))
    if not iban:
        errors["iban"] = "Enter the IBAN."
    elif not is_valid_iban(iban):
        errors["iban"] = "This IBAN is not valid. Check it for typos."

    reference = " ".join(form.get("reference", "").split())
    if not reference:
        errors["reference"] = "Enter a payment reference."
    elif not _REFERENCE.fullmatch(reference):
        errors["reference"] = (
            "Use at most 35 letters, digits, spaces and the characters / - ? : ( ) . , ' +"
        )

    if errors:
        return None, errors
    return PaymentDetails(amount=amount, iban=iban, reference=reference), {}
