"""Candidates for a target that no longer matches, read off what the failed step recorded.

A portal renamed a button, or added a second one with the same name: the step failed and its
observation lists what the page showed instead. Each candidate is an element of that
observation, ranked by how much it looks like what the step wanted (the same kind of element,
a similar name, shared words, its place among the elements of its kind), with the reasons in
words, and the target that would find it. Nothing here changes a workflow: a person picks one,
and the draft that records the choice is published the normal way. No Django, no browser.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any

from sessions.engine.steps.language import ARIA_ROLES, Target

# The roles a label or a placeholder names: form fields.
FIELD_ROLES = frozenset(
    {"textbox", "searchbox", "combobox", "spinbutton", "checkbox", "radio", "switch", "slider"}
)
# Below this, an element is too unlike the target to be worth a person's look.
MINIMUM_SCORE = 0.4
_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True)
class Candidate:
    """An element of the failed step's observation that may be what the step meant."""

    number: int
    role: str
    name: str
    box: dict[str, float] | None
    target: Target
    score: float
    reasons: tuple[str, ...]
    # How many elements of the same observation the proposed target would find (1 is the aim).
    matches: int


def heal_candidates(
    target: Target, elements: Sequence[Mapping[str, Any]], *, limit: int = 5
) -> list[Candidate]:
    """The elements of ``elements`` (an observation's, as recorded) most like ``target``, best
    first, at most ``limit``."""
    wanted = target.readable_name
    roles = _roles_meant(target)
    named = [e for e in elements if str(e.get("name") or "").strip() and e.get("role")]
    found: list[Candidate] = []
    for element in named:
        role, name = str(element["role"]), " ".join(str(element["name"]).split())
        score, reasons = _likeness(wanted, roles, role, name)
        if role in roles and sum(1 for e in named if e["role"] == role) == 1:
            score += 0.15
            reasons.append(f"the only {role} on the page")
        if score < MINIMUM_SCORE:
            continue
        alike = [e for e in named if e["role"] == role and " ".join(str(e["name"]).split()) == name]
        proposed = _target_for(target, role, name, alike, element)
        if len(alike) > 1:
            place = alike.index(element) + 1
            reasons.append(f"number {place} of {len(alike)} elements with this name")
        found.append(
            Candidate(
                number=int(element.get("number") or 0),
                role=role,
                name=name,
                box=element.get("box"),
                target=proposed,
                score=round(score, 3),
                reasons=tuple(reasons),
                matches=1 if len(alike) == 1 or proposed.nth is not None else len(alike),
            )
        )
    found.sort(key=lambda c: (-c.score, c.number))
    return found[:limit]


def _roles_meant(target: Target) -> frozenset[str]:
    if target.role:
        return frozenset({target.role})
    if target.kind in ("label", "placeholder"):
        return FIELD_ROLES
    return frozenset()


def _likeness(wanted: str, roles: frozenset[str], role: str, name: str) -> tuple[float, list[str]]:
    reasons: list[str] = []
    score = 0.0
    if role in roles:
        score += 0.35
        reasons.append(f"the same kind of element ({role})")
    if not wanted:
        return score, reasons
    ratio = SequenceMatcher(None, wanted.casefold(), name.casefold()).ratio()
    if ratio >= 0.5:
        score += 0.5 * ratio
        reasons.append(f"its name '{name}' is {round(ratio * 100)}% like '{wanted}'")
    wanted_words = {w.casefold() for w in _WORD.findall(wanted)}
    shared = wanted_words & {w.casefold() for w in _WORD.findall(name)}
    if shared and wanted_words:
        score += 0.3 * len(shared) / len(wanted_words)
        words = ", ".join(f"'{w}'" for w in sorted(shared))
        reasons.append(f"its name shares {words}")
    return score, reasons


def _target_for(
    original: Target,
    role: str,
    name: str,
    alike: list[Mapping[str, Any]],
    element: Mapping[str, Any],
) -> Target:
    """The target a person would write for this element: the original's way of naming (a label
    stays a label), by role and name otherwise; ``nth`` only when the name is not enough."""
    nth = alike.index(element) if len(alike) > 1 else None
    frame = list(original.frame)
    if original.kind in ("label", "placeholder") and role in FIELD_ROLES:
        return Target.model_validate(
            {original.kind: name, "exact": True, "nth": nth, "frame": frame}
        )
    if role in ARIA_ROLES:
        return Target(role=role, name=name, exact=True, nth=nth, frame=frame)
    return Target(text=name, exact=True, nth=nth, frame=frame)
