"""The facts a reviewer decides on (amount, payee, reference), as every card, list and message
shows them, with a warning wherever the page did not show the same value.

The gate froze them in the evidence (``sessions.engine.facts``); a request from before a workflow
declared any shows the amount of its money parameter, as it always did.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from approvals.models import ApprovalRequest
from workflows.money import read_amount
from workflows.schema import DECISION_FACTS


@dataclass(frozen=True)
class DecisionFact:
    fact: str  # a key of DECISION_FACTS
    label: str
    text: str  # as shown: "1,250.00 EUR", "Acme GmbH"
    amount: Decimal | None = None
    currency: str = ""
    warning: str = ""


def _fact(entry: dict[str, Any]) -> DecisionFact:
    fact = str(entry.get("fact") or "")
    label = DECISION_FACTS.get(fact, fact.capitalize())
    value = entry.get("value")
    if value is None:
        return DecisionFact(
            fact=fact,
            label=label,
            text="not read yet",
            warning=f"The run had not read {entry.get('name')} when it asked.",
        )
    text, currency = str(value), str(entry.get("currency") or "")
    amount = None
    if fact == "amount":
        # The gate read the number off the page once ("amounts": now, then earlier).
        read = (entry.get("amounts") or [None])[0] if "amounts" in entry else read_amount(text)
        amount = None if read is None else Decimal(str(read))
    if amount is not None:
        text = f"{amount:,.2f} {currency}".strip()
    warning = ""
    if entry.get("read_earlier") is not None:
        warning = (
            f"The page now shows {value}; the run read {entry['read_earlier']} earlier. "
            "Check which is right before you decide."
        )
    elif entry.get("on_page") is False:
        warning = f"The page does not show this {label.lower()}."
    return DecisionFact(
        fact=fact, label=label, text=text, amount=amount, currency=currency, warning=warning
    )


def approval_facts(approval: ApprovalRequest) -> list[DecisionFact]:
    """What the reviewer decides on, in the order of DECISION_FACTS."""
    evidence = approval.evidence or {}
    if "facts" in evidence:
        return [_fact(entry) for entry in evidence["facts"] if isinstance(entry, dict)]
    inputs = evidence.get("inputs") or {}
    document = approval.run.version.document or {}
    for parameter in document.get("parameters", []):
        if parameter.get("type") == "money" and parameter.get("name") in inputs:
            entry = {
                "fact": "amount",
                "name": parameter["name"],
                "value": inputs[parameter["name"]],
                "currency": parameter.get("currency") or "",
            }
            return [_fact(entry)]
    return []


def approval_amounts(approval: ApprovalRequest) -> list[Decimal | None]:
    """Every amount the request carries, None where one could not be read: the amount fact as
    the page shows it now and as the run read it earlier, and the workflow's money parameter as
    launched. A threshold compares the largest; an unreadable one counts as over it."""
    evidence = approval.evidence or {}
    found: list[Decimal | None] = []
    for entry in evidence.get("facts") or []:
        if isinstance(entry, dict) and entry.get("fact") == "amount" and "amounts" in entry:
            found += [None if a is None else Decimal(str(a)) for a in entry["amounts"]]
    inputs = evidence.get("inputs") or {}
    document = approval.run.version.document or {}
    for parameter in document.get("parameters", []):
        if parameter.get("type") == "money" and inputs.get(parameter.get("name")) is not None:
            found.append(read_amount(str(inputs[parameter["name"]])))
    return found


def approval_amount(approval: ApprovalRequest) -> tuple[Decimal, str] | None:
    """The request's amount and currency (None when it has none or it is not a number)."""
    for fact in approval_facts(approval):
        if fact.fact == "amount" and fact.amount is not None:
            return fact.amount, fact.currency
    return None


def facts_line(approval: ApprovalRequest) -> str:
    """The facts in one line, for a push message or a mail's first line: "1,250.00 EUR · Payee
    Acme GmbH · Reference INV-117"; "" when the workflow declares none."""
    parts = []
    for fact in approval_facts(approval):
        parts.append(fact.text if fact.fact == "amount" else f"{fact.label} {fact.text}")
    return " · ".join(parts)
