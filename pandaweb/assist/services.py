"""Optional help from a language model, off unless an endpoint is configured
(``PANDAWEB_ASSIST_URL``, ``PANDAWEB_ASSIST_MODEL``, ``PANDAWEB_ASSIST_KEY``).

The model only ever proposes: it orders healing candidates, or picks the element a person
describes from the numbered elements of the step's page (a closed menu), and the person then
picks. What it reads is page words only (the step's kind, the target's description, elements'
roles and names, the reasons they were proposed), with the run's inputs and outputs put back as
the references that name them wherever the page echoes them: no field's content, no typed value,
no secret (observations are recorded with secrets masked). Every call is in the audit trail
with its prompt's size and the model's answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction

from pandaweb.assist.client import ChatModel, ModelUnavailable
from pandaweb.audit.services import audit_record
from sessions.engine.healing import Candidate

RANKING_SYSTEM = (
    "You help a person repair a browser automation step whose target element was renamed or "
    "moved. You get what the step looked for and numbered candidate elements of the page. "
    'Answer with JSON only: {"order": [numbers, most likely first]}, using only the numbers '
    "given; leave out candidates that are clearly not the element."
)
_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)
RANKING = "rank healing candidates"


def assist_model() -> ChatModel | None:
    """The configured model, or None: assistance is off by default."""
    if not settings.ASSIST_URL:
        return None
    return ChatModel(url=settings.ASSIST_URL, model=settings.ASSIST_MODEL, key=settings.ASSIST_KEY)


def assist_rank_candidates(
    *,
    user: User,
    run_id: int,
    step_kind: str,
    looked_for: str,
    candidates: Sequence[Candidate],
    run_values: Mapping[str, str],
) -> list[int]:
    """The candidates' numbers in the order the model proposes (only numbers it was given).
    ``run_values`` (reference → value) are put back as references wherever page words echo
    them. Raises ModelUnavailable, in people's words, when assistance is off or the model
    fails."""
    model = assist_model()
    if model is None:
        raise ModelUnavailable("no model is configured (PANDAWEB_ASSIST_URL)")
    lines = [f"The {step_kind} step looked for {looked_for}.", "Candidates:"]
    for candidate in candidates:
        reasons = _redacted("; ".join(candidate.reasons), run_values)
        name = json.dumps(_redacted(candidate.name, run_values))
        lines.append(f"[{candidate.number}] {candidate.role} {name}: {reasons}")
    prompt = "\n".join(lines)
    try:
        answer = model.ask(RANKING_SYSTEM, prompt)
    except ModelUnavailable as exc:
        _logged(user, run_id, model, prompt, answer="", error=str(exc), purpose=RANKING)
        raise
    _logged(user, run_id, model, prompt, answer=answer, error="", purpose=RANKING)
    given = [c.number for c in candidates]
    order = _numbers(answer)
    return [number for number in dict.fromkeys(order) if number in given]


CHOOSING_SYSTEM = (
    "You help a person point a browser automation step at an element of a page. You get their "
    "description and the page's numbered elements (role and accessible name). Answer with JSON "
    'only: {"number": the number of the element they mean}, or {"number": null} when none fits.'
)
# The prompt lists at most this many elements, the interactive ones first.
MENU_LIMIT = 400


def assist_choose_element(
    *,
    user: User,
    run_id: int,
    description: str,
    elements: Sequence[Mapping[str, Any]],
    run_values: Mapping[str, str],
) -> int | None:
    """The number of the element of ``elements`` the model says ``description`` means, chosen
    from the numbers it was shown only (a closed menu: never a selector of its own), or None.
    Raises ModelUnavailable, in people's words, when assistance is off or the model fails."""
    model = assist_model()
    if model is None:
        raise ModelUnavailable("no model is configured (PANDAWEB_ASSIST_URL)")
    named = [e for e in elements if e.get("role") and str(e.get("name") or "").strip()]
    named.sort(key=lambda e: not e.get("interactive"))
    menu = named[:MENU_LIMIT]
    # Role and name only: an element's value is what the run typed, never the model's to read.
    lines = [f"Description: {description}", "Elements:"]
    for element in menu:
        name = json.dumps(_redacted(" ".join(str(element["name"]).split()), run_values))
        lines.append(f"[{element['number']}] {element['role']} {name}")
    prompt = "\n".join(lines)
    try:
        answer = model.ask(CHOOSING_SYSTEM, prompt)
    except ModelUnavailable as exc:
        _logged(user, run_id, model, prompt, answer="", error=str(exc), purpose="choose an element")
        raise
    _logged(user, run_id, model, prompt, answer=answer, error="", purpose="choose an element")
    match = _JSON_OBJECT.search(answer)
    try:
        number = json.loads(match.group(0)).get("number") if match else None
    except (ValueError, AttributeError):
        return None
    shown = {e["number"] for e in menu}
    if isinstance(number, bool) or not isinstance(number, int):
        return None
    return number if number in shown else None


def _redacted(text: str, run_values: Mapping[str, str]) -> str:
    # Longest first, so a value inside another is put back whole; short values (a "1") would
    # replace parts of unrelated words.
    for reference, value in sorted(run_values.items(), key=lambda item: -len(item[1])):
        if len(value) >= 3:
            text = text.replace(value, reference)
    return text


def _numbers(answer: str) -> list[int]:
    match = _JSON_OBJECT.search(answer)
    try:
        order = json.loads(match.group(0))["order"] if match else []
    except (ValueError, KeyError, TypeError):
        return []
    return (
        [n for n in order if isinstance(n, int) and not isinstance(n, bool)]
        if isinstance(order, list)
        else []
    )


def _logged(
    user: User,
    run_id: int,
    model: ChatModel,
    prompt: str,
    *,
    answer: str,
    error: str,
    purpose: str,
) -> None:
    # Its own transaction: the call was made (and paid for) whatever the page does next.
    with transaction.atomic():
        audit_record(
            action="assist.model_called",
            object_type="run",
            object_id=run_id,
            actor=user,
            after={
                "purpose": purpose,
                "model": model.model,
                "endpoint": model.url,
                "prompt_chars": len(prompt),
                "answer": answer[:4000],
                **({"error": error[:500]} if error else {}),
            },
            run_id=run_id,
        )
