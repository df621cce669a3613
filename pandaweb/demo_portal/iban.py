"""IBAN checks (ISO 13616): the country length and the mod-97 check digits."""

from __future__ import annotations

import re

# Lengths for the countries a European supplier's customers are likely to use; other countries
# only get the generic length bounds, the check digits still catch typos.
_COUNTRY_LENGTHS: dict[str, int] = {
    "AT": 20,
    "BE": 16,
    "CH": 21,
    "CZ": 24,
    "DE": 22,
    "DK": 18,
    "ES": 24,
    "FI": 18,
    "FR": 27,
    "GB": 22,
    "IE": 22,
    "IT": 27,
    "LU": 20,
    "NL": 18,
    "NO": 15,
    "PL": 28,
    "PT": 25,
    "SE": 24,
}

_SHAPE = re.compile(r"[A-Z]{2}[0-9]{2}[A-Z0-9]{11,30}")


def normalize_iban(value: str) -> str:
    """The IBAN without spaces, upper case (the "electronic format")."""
    return "".join(value.split()).upper()


def is_valid_iban(value: str) -> bool:
    iban = normalize_iban(value)
    if not _SHAPE.fullmatch(iban):
        return False
    expected_length = _COUNTRY_LENGTHS.get(iban[:2])
    if expected_length is not None and len(iban) != expected_length:
        return False
    rearranged = iban[4:] + iban[:4]
    # int(c, 36) maps 0-9 to themselves and A-Z to 10-35, exactly the ISO 13616 letter values.
    digits = "".join(str(int(char, 36)) for char in rearranged)
    return int(digits) % 97 == 1


def format_iban(value: str) -> str:
    """The IBAN in groups of four, as printed on paper."""
    iban = normalize_iban(value)
    return " ".join(iban[i : i + 4] for i in range(0, len(iban), 4))
