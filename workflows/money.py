"""Reading an amount of money the way a person writes or copies it, never changing its value.

Accepted: digits with an optional sign; a decimal point (or, where the parameter says so, a decimal
comma) followed by at most two decimals; grouping separators only between groups of three digits
(``7,130.90``, ``7 130.90``, ``7'130.90``; ``7.130,90`` with a decimal comma); the declared
currency's code or sign before or after the number (``7,130.90 EUR``, ``€7,130.90``). Anything that
could be read two ways is refused with both readings, so nobody pays 54,770 instead of 547.70.

No Django here: the schema, the launch service and the tests use it alike.
"""

from __future__ import annotations

import re
from decimal import Decimal

# Amounts beyond this are typing mistakes (and would not fit the two-decimal quantization).
MAX_INTEGER_DIGITS = 15
# Longer text is refused before any parsing: nobody types a 100-character amount.
MAX_TEXT_LENGTH = 64

SIGNS: dict[str, str] = {
    "€": "EUR", "$": "USD", "£": "GBP", "¥": "JPY", "₹": "INR", "₩": "KRW", "₺": "TRY",
    "₽": "RUB", "₪": "ILS", "₴": "UAH", "₫": "VND", "฿": "THB", "zł": "PLN", "Kč": "CZK",
    "kr": "SEK", "Fr.": "CHF", "CHF": "CHF",
}  # fmt: skip
# A sign shared by several currencies stands for each of them ($ for USD, CAD, AUD …).
SHARED_SIGNS: dict[str, set[str]] = {
    "$": {"USD", "CAD", "AUD", "NZD", "SGD", "HKD", "MXN"},
    "kr": {"SEK", "NOK", "DKK", "ISK"},
    "¥": {"JPY", "CNY"},
}
# Spaces people and portals put between groups: plain, no-break, narrow no-break, thin.
SPACES = " \u00a0\u202f\u2009"

_CURRENCY_AFFIX = re.compile(
    r"^(?P<before>[A-Za-z]{3}|[^\d\s+\-.,]{1,3}\.?)?\s*(?P<number>[^A-Za-z]*?)\s*"
    r"(?P<after>[A-Za-z]{3}|[^\d\s.,]{1,3}\.?)?$"
)
_SIGNED = re.compile(r"^(?P<sign>[+-]?)\s*(?P<body>.*)$", re.DOTALL)


class MoneyError(ValueError):
    """The amount could not be read; the message says why, in words for the person typing it."""


def parse_money(text: str, *, currency: str, decimal_comma: bool = False) -> Decimal:
    """The amount ``text`` states, with two decimals; raises MoneyError saying why not."""
    shown = text.strip()
    if len(shown) > MAX_TEXT_LENGTH:
        raise MoneyError(f"must be at most {MAX_TEXT_LENGTH} characters")
    if not shown:
        raise MoneyError("is required")
    number = _without_currency(shown, currency)
    match = _SIGNED.match(number)
    assert match is not None  # the pattern matches any text
    sign, body = match["sign"], match["body"].strip()
    if not body or (not body[0].isdigit() and body[0] not in ".,"):
        raise MoneyError(f"'{shown}' is not an amount: write it like 1250.00")
    if any(ch in "eE" for ch in body):
        raise MoneyError(f"'{shown}': write the amount in digits, like 1250.00")
    # decimal_comma: "," is the decimal mark and "." groups; otherwise the other way round.
    decimal, grouping = (",", ".") if decimal_comma else (".", ",")
    for ch in body:
        if not (ch.isascii() and ch.isdigit()) and ch not in f"{decimal}{grouping}'{SPACES}":
            raise MoneyError(f"'{shown}' is not an amount: write it like 1250.00")
    whole, _, fraction = body.partition(decimal)
    if decimal in fraction:
        raise MoneyError(f"'{shown}' has more than one decimal mark '{decimal}'")
    if not whole and fraction:
        whole = "0"
    if fraction and not fraction.isdigit():
        raise MoneyError(f"'{shown}': after the decimal mark only digits may follow")
    digits = _ungrouped(whole, grouping)
    if digits is None:
        raise MoneyError(_ambiguity(shown, whole, fraction, decimal, grouping))
    if len(fraction) == 3 and digits == whole and len(whole) <= 3:
        # "1.234" is 1.234 here, and 1234 where the mark groups thousands: neither is guessed.
        as_grouped = f"{int(whole + fraction):,}"
        if decimal == ",":
            as_grouped = as_grouped.replace(",", ".")
        raise MoneyError(
            f"'{shown}' has more than 2 decimals (if it means {as_grouped}, "
            f"write {int(whole + fraction)}{decimal}00)"
        )
    if len(fraction) > 2:
        raise MoneyError(f"'{shown}' has more than 2 decimals")
    digits = digits.lstrip("0") or "0"
    if len(digits) > MAX_INTEGER_DIGITS:
        raise MoneyError(
            f"'{shown}' is too large: at most {MAX_INTEGER_DIGITS} digits before the decimals"
        )
    return Decimal(f"{sign}{digits}.{fraction.ljust(2, '0')}")


def _without_currency(shown: str, currency: str) -> str:
    """``shown`` without a currency code or sign, which must name ``currency``."""
    match = _CURRENCY_AFFIX.match(shown)
    if match is None:
        return shown
    before, after = match["before"], match["after"]
    if before and after:
        raise MoneyError(f"'{shown}' names a currency twice")
    marker = before or after
    if not marker:
        return shown
    if not any(ch.isdigit() for ch in match["number"]):
        raise MoneyError(f"'{shown}' is not an amount: write it like 1250.00")
    named = _currencies(marker)
    if not named:
        raise MoneyError(
            f"'{shown}': '{marker}' is not a currency sign; this amount is in {currency}"
        )
    if currency not in named:
        stated = f"{marker} ({', '.join(sorted(named))})" if len(named) > 1 else next(iter(named))
        raise MoneyError(f"'{shown}' is in {stated}, but this amount is in {currency}")
    return match["number"]


def _currencies(marker: str) -> set[str]:
    if len(marker) == 3 and marker.isalpha() and marker.isascii():
        return {marker.upper()}
    if marker in SHARED_SIGNS:
        return SHARED_SIGNS[marker]
    code = SIGNS.get(marker)
    return {code} if code else set()


def _ungrouped(whole: str, grouping: str) -> str | None:
    """The digits of ``whole`` once its grouping separators are checked and removed; None when a
    separator is not between groups of three (``1,,,2``, ``547,70``, ``12,3456``)."""
    # One kind of separator per number: the grouping mark, an apostrophe or a kind of space.
    separators = {ch for ch in whole if not ch.isdigit()}
    if len(separators) > 1 or (separators and not separators <= {grouping, "'", *SPACES}):
        return None
    if not separators:
        return whole
    (separator,) = separators
    groups = whole.split(separator)
    if not 1 <= len(groups[0]) <= 3 or any(len(group) != 3 for group in groups[1:]):
        return None
    return "".join(groups)


def _ambiguity(shown: str, whole: str, fraction: str, decimal: str, grouping: str) -> str:
    """Why a number with misplaced separators is refused, with the readings it could have."""
    marks = [ch for ch in whole if not ch.isdigit()]
    if not fraction and marks and len(set(marks)) == 1 and marks.count(marks[0]) == 1:
        head, _, tail = whole.partition(marks[0])
        if head.isdigit() and tail.isdigit() and marks[0] == grouping and len(tail) <= 2:
            as_decimal = f"{head.lstrip('0') or '0'}.{tail.ljust(2, '0')}"
            as_grouped = f"{int(head + tail):,}"
            write = as_decimal if decimal == "." else as_decimal.replace(".", ",")
            return f"'{shown}' could mean {as_decimal} or {as_grouped}: write {write}"
    return (
        f"'{shown}': separators '{grouping}' may only stand between groups of three digits, "
        f"like 7{grouping}130{decimal}90"
    )


def read_amount(text: str) -> Decimal | None:
    """The amount a page shows, however it groups and marks it ("EUR 1,250.00", "1.250,00 €",
    "7 130.90", "-12.00"), or None when ``text`` holds no number. Lenient where ``parse_money``
    is strict: it reads what a portal printed, never what a person types."""
    digits = "".join(ch for ch in text if ch.isdigit() or ch in ".,-")
    if not any(ch.isdigit() for ch in digits):
        return None
    # The last separator followed by one or two digits is the decimal mark; the others group.
    whole, mark, fraction = digits, "", ""
    for index in range(len(digits) - 1, -1, -1):
        if digits[index] in ".,":
            if len(digits) - index - 1 in (1, 2):
                whole, mark, fraction = digits[:index], ".", digits[index + 1 :]
            break
    number = whole.replace(".", "").replace(",", "")
    if number.count("-") > 1 or "-" in number[1:]:
        return None
    try:
        amount = Decimal(number + mark + fraction)
    except ArithmeticError:
        return None
    return amount if amount.is_finite() else None
