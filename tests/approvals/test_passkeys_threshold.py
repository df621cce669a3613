"""The passkey threshold reads the request's amount as the page printed it, and fails closed:
an amount written with a decimal comma is not a thousandth of itself, every amount the request
carries counts (the page's now, the one read earlier, the money parameter's), and one that
cannot be read asks for a passkey."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from approvals import passkeys
from approvals.models import ApprovalRequest
from tests.approvals.reach import open_request, reach_workflow
from workflows.models import Workflow
from workflows.money import read_amount

pytestmark = pytest.mark.django_db


@pytest.fixture
def above_1000(operator: User, acme_credential: Any) -> Workflow:
    return reach_workflow(operator, passkey="above", passkey_above_amount="1000.00")


def with_amount(approval: ApprovalRequest, amounts: list[str | None], launched: str) -> None:
    approval.evidence = {
        **approval.evidence,
        "inputs": {**approval.evidence.get("inputs", {}), "amount": launched},
        "facts": [{"fact": "amount", "name": "charged", "source": "output",
                   "value": "7.130,90", "currency": "EUR", "amounts": amounts}],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("amounts", "launched", "needed"),
    [
        (["7130.90"], "12.00", True),  # the page's 7.130,90 is above, whatever was launched
        (["900.00", "7130.90"], "12.00", True),  # read earlier above, the page now below
        (["900.00"], "7130.90", True),  # the money parameter as launched is above
        ([None], "12.00", True),  # the page's amount could not be read
        (["900.00", "950.00"], "12.00", False),
    ],
)
def test_the_largest_amount_the_request_carries_decides_and_none_is_guessed(
    operator: User, above_1000: Workflow, amounts: list[str | None], launched: str, needed: bool
) -> None:
    approval = open_request(operator, above_1000)
    with_amount(approval, amounts, launched)
    assert passkeys.passkey_required(approval) is needed


def test_the_gate_reads_a_decimal_comma_as_the_page_means_it() -> None:
    assert str(read_amount("7.130,90 €")) == "7130.90"
    assert str(read_amount("EUR 1,250.00")) == "1250.00"
    assert str(read_amount("1.250")) == "1250"
    assert read_amount("n/a") is None
