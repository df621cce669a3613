"""Money is read strictly: never silently changed, refused with the reading that was rejected."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workflows.money import MAX_INTEGER_DIGITS, MoneyError, parse_money


@pytest.mark.parametrize(
    ("text", "decimal_comma", "amount"),
    [
        ("1250.00", False, "1250.00"),
        ("7,130.90 EUR", False, "7130.90"),
        ("EUR 7,130.90", False, "7130.90"),
        ("€7,130.90", False, "7130.90"),
        ("7 130.90 €", False, "7130.90"),
        ("7\u202f130.90", False, "7130.90"),
        ("7'130.90", False, "7130.90"),
        ("1,234,567", False, "1234567.00"),
        ("-12.5", False, "-12.50"),
        (".5", False, "0.50"),
        ("eur 12", False, "12.00"),
        ("547,70", True, "547.70"),
        ("1.234.567,89 EUR", True, "1234567.89"),
        ("7 130,90", True, "7130.90"),
    ],
)
def test_it_reads_what_people_write_and_copy(text: str, decimal_comma: bool, amount: str) -> None:
    assert parse_money(text, currency="EUR", decimal_comma=decimal_comma) == Decimal(amount)


@pytest.mark.parametrize(
    ("text", "decimal_comma", "message"),
    [
        ("547,70", False, "'547,70' could mean 547.70 or 54,770: write 547.70"),
        ("547.70", True, "'547.70' could mean 547.70 or 54,770: write 547,70"),
        ("1,,,2", False, "may only stand between groups of three digits"),
        ("12,3456.00", False, "may only stand between groups of three digits"),
        ("1,234.5,6", False, "after the decimal mark only digits may follow"),
        ("1.5.6", False, "more than one decimal mark"),
        ("1 234,567.00", False, "may only stand between groups of three digits"),
        ("12.345", False, "more than 2 decimals (if it means 12,345, write 12345.00)"),
        ("7,130.90 USD", False, "is in USD, but this amount is in EUR"),
        ("$7,130.90", False, "but this amount is in EUR"),
        ("1e30", False, "write the amount in digits"),
        ("1e309", False, "write the amount in digits"),
        ("9" * 29, False, "is too large"),
        ("NaN", False, "is not an amount"),
        ("Infinity", False, "is not an amount"),
        ("EUR 5 EUR", False, "names a currency twice"),
        ("٣٤", False, "is not an amount"),
        ("1" * 100, False, "at most 64 characters"),
    ],
)
def test_it_refuses_what_it_would_have_to_guess(
    text: str, decimal_comma: bool, message: str
) -> None:
    with pytest.raises(MoneyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_money(text, currency="EUR", decimal_comma=decimal_comma)


def test_a_shared_sign_is_accepted_for_each_of_its_currencies() -> None:
    assert parse_money("$5", currency="CAD") == Decimal("5.00")
    assert parse_money("5 kr", currency="NOK") == Decimal("5.00")


amounts = st.decimals(
    min_value=Decimal(-(10**MAX_INTEGER_DIGITS) + 1),
    max_value=Decimal(10**MAX_INTEGER_DIGITS - 1),
    places=2,
    allow_nan=False,
    allow_infinity=False,
)


def styles(amount: Decimal) -> list[tuple[str, bool]]:
    """The amount in every style the parser accepts, with whether it uses a decimal comma."""
    plain = f"{amount:.2f}"
    grouped = f"{amount:,.2f}"
    return [
        (plain, False),
        (grouped, False),
        (grouped.replace(",", " "), False),
        (grouped.replace(",", "\u00a0"), False),
        (grouped.replace(",", "'"), False),
        (f"{grouped} EUR", False),
        (f"EUR {grouped}", False),
        (f"€{grouped}", False),
        (plain.replace(".", ","), True),
        (grouped.replace(",", "_").replace(".", ",").replace("_", "."), True),
        (f"{grouped.replace(',', ' ').replace('.', ',')} €", True),
    ]


@settings(max_examples=300, deadline=None)
@given(amounts)
def test_every_accepted_style_reads_back_the_same_amount(amount: Decimal) -> None:
    for text, decimal_comma in styles(amount):
        assert parse_money(text, currency="EUR", decimal_comma=decimal_comma) == amount, text


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=80), st.booleans())
def test_any_text_is_read_or_refused_in_words(text: str, decimal_comma: bool) -> None:
    try:
        amount = parse_money(text, currency="EUR", decimal_comma=decimal_comma)
    except MoneyError as exc:
        assert str(exc)
    else:
        assert amount == amount.quantize(Decimal("0.01"))
        assert len(str(abs(amount)).split(".")[0]) <= MAX_INTEGER_DIGITS
