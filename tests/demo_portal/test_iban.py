from __future__ import annotations

import pytest

from pandaweb.demo_portal.iban import format_iban, is_valid_iban, normalize_iban


@pytest.mark.parametrize(
    "iban",
    [
        "DE89 3704 0044 0532 0130 00",
        "de89370400440532013000",
        "GB82 WEST 1234 5698 7654 32",
        "NL91ABNA0417164300",
        "FR14 2004 1010 0505 0001 3M02 606",
        "BE68 5390 0754 7034",
    ],
)
def test_it_accepts_valid_ibans(iban: str) -> None:
    assert is_valid_iban(iban)


@pytest.mark.parametrize(
    "iban",
    [
        "",
        "DE89 3704 0044 0532 0130 01",  # one digit off
        "DE98 3704 0044 0532 0130 00",  # swapped check digits
        "DE89 3704 0044 0532 0130",  # too short for Germany
        "GB82 WEST 1234 5698 7654 3",
        "NL91-ABNA-0417-1643-00",
        "8989 3704 0044 0532 0130 00",
    ],
)
def test_it_rejects_invalid_ibans(iban: str) -> None:
    assert not is_valid_iban(iban)


def test_it_normalizes_and_formats_ibans() -> None:
    assert normalize_iban(" gb82 west 1234\t5698 7654 32 ") == "GB82WEST12345698765432"
    assert format_iban("GB82WEST12345698765432") == "GB82 WEST 1234 5698 7654 32"
