"""The facts a reviewer decides on (amount, payee, reference), read at an approval gate.

Each comes from the run's inputs or from an output an extract step read earlier; an output is read
again off the page as it is now where its element is still there, so a request asked again after
the page changed shows the page's value, not the one read before. Every fact is compared with the
page's text: a value the page does not show is the first thing a reviewer should see.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from playwright.sync_api import Error as PlaywrightError

from sessions.engine import wording
from sessions.engine.steps.base import StepFailed
from sessions.engine.steps.extract import ExtractField, extract_field
from workflows.money import read_amount
from workflows.schema import DECISION_FACTS, FactSource

if TYPE_CHECKING:
    from sessions.engine.runner import Runner

# Numbers as a page writes amounts: "7,130.90", "7.130,90", "7 130.90", "-12.00", "1250".
# A thousands separator must be the same between every group; a number never starts or ends
# inside a longer one.
_AMOUNT_ON_PAGE = re.compile(
    r"(?<!\d)-?(?:\d{1,3}([ ,.'\u00a0\u202f])\d{3}(?:\1\d{3})*|\d+)(?:[.,]\d{1,2})?(?!\d)"
)
# Reading an element that is still on the page: the evidence is read while a person waits.
REREAD_TIMEOUT_MS = 1_000


def read_facts(runner: Runner, page_text: str) -> list[dict[str, Any]]:
    """The declared facts with their values now, each marked with whether the page shows it."""
    values = {**runner.plan.inputs, **runner.outputs}
    facts = []
    for source in runner.plan.facts:
        earlier = values.get(source.name)
        value = earlier
        if source.source == "output":
            now = _reread(runner, source.name)
            if now is not None:
                value = now
        currency = source.currency or str(values.get(source.currency_from) or "")
        fact: dict[str, Any] = {
            "fact": source.fact,
            "label": DECISION_FACTS[source.fact],
            "name": source.name,
            "source": source.source,
            "value": None if value is None else wording.plain(value),
            "currency": currency,
        }
        if value is not None:
            fact["on_page"] = shown_on_page(source, str(value), page_text)
        if earlier is not None and value is not None and not same_value(source, earlier, value):
            fact["read_earlier"] = wording.plain(earlier)
        if source.money:
            # Read here once, as the page shows it: every reader of the evidence (the passkey
            # threshold above all) takes this number, never its own reading of the text.
            amounts = [read_amount(str(v)) for v in (value, earlier) if v is not None]
            fact["amounts"] = [None if a is None else str(a) for a in amounts]
        facts.append(fact)
    return facts


def _reread(runner: Runner, name: str) -> Any:
    """The output ``name`` read again off the page now, or None where its element is gone."""
    extract = _extract_of(runner.plan.steps, name)
    if extract is None or extract.kind == "rows":
        return None
    try:
        if runner.locate(runner.page, extract.target, strict=False).count() != 1:
            return None
        return extract_field(runner, runner.page, extract, runner._scaled(REREAD_TIMEOUT_MS))
    except (PlaywrightError, StepFailed):
        return None


def _extract_of(steps: list[dict[str, Any]], name: str) -> ExtractField | None:
    for step in steps:
        if step.get("type") != "extract":
            continue
        for field in step.get("fields") or []:
            if field.get("name") == name:
                return ExtractField.model_validate(field)
    return None


def _folded(text: str) -> str:
    return "".join(text.split()).casefold()


def same_value(source: FactSource, left: Any, right: Any) -> bool:
    if source.money:
        a, b = read_amount(str(left)), read_amount(str(right))
        if a is not None and b is not None:
            return a == b
    return _folded(str(left)) == _folded(str(right))


def shown_on_page(source: FactSource, value: str, page_text: str) -> bool:
    """Whether the page's text shows ``value``: an amount as any number equal to it (however
    the page groups and marks it), other values whatever their spacing and letter case."""
    if source.money:
        wanted = read_amount(value)
        if wanted is None:
            return False
        return any(read_amount(m[0]) == wanted for m in _AMOUNT_ON_PAGE.finditer(page_text))
    folded = _folded(value)
    return bool(folded) and folded in _folded(page_text)
