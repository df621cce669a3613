"""What a model is asked, and how its answer is read. No Django: the web side writes the prompts
when a person asks, the worker sends them, the page reads the answers.

A prompt is page words only (the step's kind, the target's description, elements' roles and
names, the reasons they were proposed), with the run's inputs and outputs put back as the
references that name them wherever the page echoes them: no field's content, no typed value, no
secret (observations are recorded with secrets masked). An answer is read against the numbers
the prompt offered only: the model proposes from a closed menu, never a selector of its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sessions.engine.healing import Candidate

RANKING_SYSTEM = (
    "You help a person repair a browser automation step whose target element was renamed or "
    "moved. You get what the step looked for and numbered candidate elements of the page. "
    'Answer with JSON only: {"order": [numbers, most likely first]}, using only the numbers '
    "given; leave out candidates that are clearly not the element."
)
CHOOSING_SYSTEM = (
    "You help a person point a browser automation step at an element of a page. You get their "
    "description and the page's numbered elements (role and accessible name). Answer with JSON "
    'only: {"number": the number of the element they mean}, or {"number": null} when none fits.'
)
DRAFTING_SYSTEM = (
    "You help a person write the steps of a browser automation on the page they have open. You "
    "get their goal, the launch parameters and credential fields the steps may type (by name; "
    "their values are not yours to see), and the page's numbered elements (role and accessible "
    'name). Answer with JSON only: {"steps": [...]}, the steps to take on this page, in order, '
    'each one of {"do": "click", "element": n}, {"do": "check", "element": n}, '
    '{"do": "fill" or "select", "element": n, "value": {"param": name} or '
    '{"credential": "credential.field"} or {"text": words}}. Use only the numbers given; type '
    "a password or a code only from a credential field."
)
DRAFT_KINDS = ("click", "check", "fill", "select")
# At most this many steps are read from one answer: a page is a handful of actions.
DRAFT_LIMIT = 15
# The prompt lists at most this many elements, the interactive ones first.
MENU_LIMIT = 400
_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


def ranking_prompt(
    *,
    step_kind: str,
    looked_for: str,
    candidates: Sequence[Candidate],
    run_values: Mapping[str, str],
) -> str:
    """The question that has the model order ``candidates``. ``run_values`` (reference → value)
    are put back as references wherever page words echo them."""
    lines = [f"The {step_kind} step looked for {looked_for}.", "Candidates:"]
    for candidate in candidates:
        reasons = _redacted("; ".join(candidate.reasons), run_values)
        name = json.dumps(_redacted(candidate.name, run_values))
        lines.append(f"[{candidate.number}] {candidate.role} {name}: {reasons}")
    return "\n".join(lines)


def ranking_read(answer: str, offered: Sequence[int]) -> list[int]:
    """The numbers of ``offered`` in the order the answer proposes, each once."""
    match = _JSON_OBJECT.search(answer)
    try:
        order = json.loads(match.group(0))["order"] if match else []
    except (ValueError, KeyError, TypeError):
        return []
    if not isinstance(order, list):
        return []
    numbers = [n for n in order if isinstance(n, int) and not isinstance(n, bool)]
    return [number for number in dict.fromkeys(numbers) if number in offered]


def choosing_prompt(
    *,
    description: str,
    elements: Sequence[Mapping[str, Any]],
    run_values: Mapping[str, str],
) -> tuple[str, list[int]]:
    """The question that has the model pick the element of ``elements`` a person described, and
    the numbers it offers (named elements, the interactive ones first, at most MENU_LIMIT)."""
    named = [e for e in elements if e.get("role") and str(e.get("name") or "").strip()]
    named.sort(key=lambda e: not e.get("interactive"))
    menu = named[:MENU_LIMIT]
    # Role and name only: an element's value is what the run typed, never the model's to read.
    lines = [f"Description: {description}", "Elements:"]
    for element in menu:
        name = json.dumps(_redacted(" ".join(str(element["name"]).split()), run_values))
        lines.append(f"[{element['number']}] {element['role']} {name}")
    return "\n".join(lines), [int(e["number"]) for e in menu]


def choosing_read(answer: str, offered: Sequence[int]) -> int | None:
    """The number the answer chose, if the prompt offered it (a JSON true is not element 1)."""
    match = _JSON_OBJECT.search(answer)
    try:
        number = json.loads(match.group(0)).get("number") if match else None
    except (ValueError, AttributeError):
        return None
    if isinstance(number, bool) or not isinstance(number, int):
        return None
    return number if number in offered else None


def _redacted(text: str, run_values: Mapping[str, str]) -> str:
    # Longest first, so a value inside another is put back whole; short values (a "1") would
    # replace parts of unrelated words.
    for reference, value in sorted(run_values.items(), key=lambda item: -len(item[1])):
        if len(value) >= 3:
            text = text.replace(value, reference)
    return text


def drafting_prompt(
    *,
    goal: str,
    elements: Sequence[Mapping[str, Any]],
    parameters: Sequence[str],
    credential_fields: Sequence[str],
    run_values: Mapping[str, str],
) -> tuple[str, list[int]]:
    """The question that has the model propose the steps toward ``goal`` on a page, and the
    element numbers it offers (interactive, named elements, at most MENU_LIMIT): names of
    parameters and credential fields, never their values."""
    menu = [e for e in elements if e.get("interactive") and str(e.get("name") or "").strip()][
        :MENU_LIMIT
    ]
    lines = [
        f"Goal: {goal}",
        f"Parameters: {', '.join(parameters) or 'none'}",
        f"Credential fields: {', '.join(credential_fields) or 'none'}",
        "Elements:",
    ]
    for element in menu:
        name = json.dumps(_redacted(" ".join(str(element["name"]).split()), run_values))
        lines.append(f"[{element['number']}] {element['role']} {name}")
    return "\n".join(lines), [int(e["number"]) for e in menu]


def drafting_read(
    answer: str,
    offered: Sequence[int],
    parameters: Sequence[str],
    credential_fields: Sequence[str],
) -> list[dict[str, Any]]:
    """The steps the answer proposes, those only that use an offered element and, for a value,
    a known parameter, a known credential field or plain words: ``{"do", "element", "value"}``
    with ``value`` as ``{{ … }}`` text, in order."""
    match = _JSON_OBJECT.search(answer)
    try:
        steps = json.loads(match.group(0)).get("steps") if match else None
    except (ValueError, AttributeError):
        return []
    read: list[dict[str, Any]] = []
    for step in steps if isinstance(steps, list) else []:
        if not isinstance(step, dict) or step.get("do") not in DRAFT_KINDS:
            continue
        number = step.get("element")
        if isinstance(number, bool) or not isinstance(number, int) or number not in offered:
            continue
        entry: dict[str, Any] = {"do": step["do"], "element": number}
        if step["do"] in ("fill", "select"):
            given = step.get("value")
            value: dict[str, Any] = given if isinstance(given, dict) else {}
            if value.get("param") in parameters:
                entry["value"] = f"{{{{ params.{value['param']} }}}}"
            elif value.get("credential") in credential_fields:
                entry["value"] = f"{{{{ secrets.{value['credential']} }}}}"
            elif isinstance(value.get("text"), str) and value["text"].strip():
                entry["value"] = value["text"].strip()[:500]
            else:
                continue
        read.append(entry)
    return read[:DRAFT_LIMIT]
