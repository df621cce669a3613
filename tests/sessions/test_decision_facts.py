"""The facts a reviewer decides on, read at the gate: an extracted amount is read again off the
page as it is when the gate asks, every fact is compared with the page's text, and a request
asked again after the page changed carries the page's new value with the one read before. A
local sandbox (system Chromium), the bundled demo portal on loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pandaweb.demo_portal.server import PortalServer
from sessions.engine.facts import shown_on_page
from sessions.engine.plan import RunPlan
from tests.sessions.test_runner_recheck import Payment
from workflows.schema import FactSource

pytestmark = pytest.mark.browser

FACTS = (
    FactSource(fact="amount", name="charged", source="output", money=True, currency="EUR"),
    FactSource(fact="payee", name="iban", source="input"),
    FactSource(fact="reference", name="invoice", source="input"),
)
# Freezes the review page: its script would put the portal's amount back within a second.
FROZEN = "for (let id = 1; id < 10000; id++) clearInterval(id);"


class FactsPayment(Payment):
    """The demo payment with the charged amount read off the review page before paying."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        submit = self.steps.pop()
        self.steps.append(
            {
                "id": "read-review",
                "type": "extract",
                "fields": [
                    {"name": "charged", "kind": "money", "target": {"test_id": "confirm-amount"}},
                ],
            }
        )
        self.steps.append(submit)

    def plan(self, **approved: Any) -> RunPlan:
        # A continuation starts from what the run read so far, as the service gives it.
        read = approved.get("approved_evidence", {}).get("outputs", {})
        return super().plan(facts=FACTS, outputs=dict(read), **approved)


@pytest.fixture
def facts_payment(
    cdp_url: str, portal: str, portal_server: PortalServer, tmp_path: Path
) -> FactsPayment:
    return FactsPayment(cdp_url, portal, portal_server, tmp_path)


def by_fact(evidence: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {fact["fact"]: fact for fact in evidence["facts"]}


def test_the_gate_reads_each_fact_and_finds_it_on_the_page(facts_payment: FactsPayment) -> None:
    facts = by_fact(facts_payment.to_the_gate().evidence)

    amount = facts_payment.inputs["amount"]
    assert facts["amount"] == {
        "fact": "amount",
        "label": "Amount",
        "name": "charged",
        "source": "output",
        "value": amount,
        "currency": "EUR",
        "on_page": True,
        # The number as the page printed it, read now and as the run read it before.
        "amounts": [amount, amount],
    }
    assert facts["payee"]["value"] == "DE97 2004 0060 0123 4567 89"
    assert facts["payee"]["on_page"] is True
    assert facts["reference"]["on_page"] is True
    assert "read_earlier" not in facts["amount"]


def test_a_request_asked_again_carries_the_page_s_new_amount_and_the_one_read_before(
    facts_payment: FactsPayment,
) -> None:
    gate = facts_payment.to_the_gate()
    read_before = facts_payment.inputs["amount"]
    facts_payment.on_page(
        FROZEN + "document.querySelector('[data-testid=confirm-amount]').textContent"
        " = 'EUR 9,999.00';"
        "document.querySelector('[data-testid=confirm-iban]').textContent = 'GB33 BUKB 2020';"
    )

    outcome, sink = facts_payment.approved(gate)

    assert outcome.status == "approval_required", outcome.reason
    assert sink.actions == []
    assert outcome.gate is not None
    facts = by_fact(outcome.gate.evidence)
    assert facts["amount"]["value"] == "9999.00"
    assert facts["amount"]["read_earlier"] == read_before
    assert facts["amount"]["amounts"] == ["9999.00", read_before]
    assert facts["amount"]["on_page"] is True
    # The payee came from the launch: the page no longer shows it.
    assert facts["payee"]["on_page"] is False
    assert facts["reference"]["on_page"] is True


@pytest.mark.parametrize(
    ("value", "page", "shown"),
    [
        ("1250.00", "Pay EUR 1,250.00 now", True),
        ("1250.00", "Pay 1250 EUR", True),
        ("7130.90", "Total: 7.130,90 €", True),
        ("7130.90", "Total 7 130.90", True),
        ("1250.00", "Pay 12,500.00", False),
        ("547.70", "54,770", False),
        ("1250.00", "Invoice 1250.5", False),
        ("1250.00", "Reference 412500", False),
    ],
)
def test_an_amount_is_on_the_page_as_any_number_of_the_same_value(
    value: str, page: str, shown: bool
) -> None:
    amount = FactSource(fact="amount", name="amount", source="input", money=True)
    assert shown_on_page(amount, value, page) is shown


def test_a_text_fact_is_on_the_page_whatever_its_spacing_and_case() -> None:
    payee = FactSource(fact="payee", name="iban", source="input")
    assert shown_on_page(payee, "DE97 2004 0060 0123", "IBAN de9720040060 0123")
    assert not shown_on_page(payee, "DE97 2004 0060 0123", "IBAN DE97 2004 0060 0124")
