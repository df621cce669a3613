"""Candidates for a target that no longer matches, read off what the failed step recorded.

A portal renamed a button, or added a second one with the same name: the step failed and its
observation lists what the page showed instead. Each candidate is an element of that
observation, ranked by how much it looks like what the step wanted (the same kind of element,
a similar name, shared words, its place among elements of one name), with the reasons in
words, and the target that would find it. Nothing here changes a workflow: a person picks one,
and the draft that records the choice is published the normal way. No Django, no browser.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any

from sessions.engine.steps.language import ARIA_ROLES, TEMPLATE, Target

# The roles a label or a placeholder names: form fields.
FIELD_ROLES = frozenset(
    {"textbox", "searchbox", "combobox", "spinbutton", "checkbox", "radio", "switch", "slider"}
)
# Below this, an element is too unlike the target to be worth a person's look.
MINIMUM_SCORE = 0.4
# Elements that share a role and a name are proposed by their place, the first few only.
MAX_PLACES = 5
_WORD = re.compile(r"\w+", re.UNICODE)
# An observation's named elements by frame and name (see named_elements).
Named = dict[tuple[str, str], list[Mapping[str, Any]]]


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
    # How many elements of the same observation (and frame) the proposed target finds: one, or
    # the target would fail on the page the step saw.
    matches: int


@dataclass(frozen=True)
class Place:
    """Where the target's element was the last time the step passed: the ``ordinal``-th element
    (0-based, in document order) of ``role``, ``seen`` saying when, in words."""

    role: str
    ordinal: int
    seen: str


def heal_candidates(
    target: Target,
    elements: Sequence[Mapping[str, Any]],
    *,
    was: Place | None = None,
    interactive_only: bool = True,
    limit: int = 5,
) -> list[Candidate]:
    """The elements of ``elements`` (an observation's, as recorded) most like ``target``, best
    first, at most ``limit``; ``was`` adds the element in the place the target's element had.
    ``interactive_only`` for a step that acts on what it finds (a heading is not clicked).

    None for a target written with ``{{ … }}`` references: the page shows one run's values,
    and a target pinned to them would fail every other run."""
    wanted = target.readable_name
    if TEMPLATE.search(wanted):
        return []
    roles = _roles_meant(target)
    named = named_elements(elements)
    # Elements by what a target can tell apart (role and name): a 1,000-row table holds 1,000
    # buttons named "View". Each element's place among those of its role, in document order.
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    ordinals: dict[int, int] = {}
    per_role: dict[str, int] = {}
    for element in elements:
        role = str(element.get("role") or "")
        ordinals[id(element)] = per_role.get(role, 0)
        per_role[role] = ordinals[id(element)] + 1
        name = _name_of(element)
        if name and role and _eligible(element, target, interactive_only=interactive_only):
            # Playwright counts ``nth`` within a frame: elements of one frame apart.
            groups.setdefault((str(element.get("frame") or ""), role, name), []).append(element)
    found: list[Candidate] = []
    for (frame, role, name), alike in groups.items():
        score, reasons = _likeness(wanted, roles, role, name)
        # The kind of element alone proposes nothing: on a page whose only button is "Log out",
        # that button is no candidate for "Submit payment".
        named_alike = len(reasons) > (1 if role in roles else 0)
        for shown, element in enumerate(alike):
            at_place = was is not None and role == was.role and ordinals[id(element)] == was.ordinal
            if shown >= MAX_PLACES and not at_place:
                continue
            total, why = score, list(reasons)
            if at_place:
                assert was is not None
                total += 0.25
                why.append(f"where the {role} was {was.seen} ({_ordinal(was.ordinal + 1)} {role})")
            if total < MINIMUM_SCORE or (wanted and not (named_alike or at_place)):
                continue
            pinned, place, of = _pinned(target, element, frame, named)
            if of > 1:
                why.append(f"number {place + 1} of {of} elements with this name")
            found.append(
                Candidate(
                    number=int(element.get("number") or 0),
                    role=role,
                    name=name,
                    box=element.get("box"),
                    target=pinned,
                    score=round(total, 3),
                    reasons=tuple(why),
                    matches=len(found_by(pinned, frame, named)),
                )
            )
    found.sort(key=lambda c: (-c.score, c.number))
    return found[:limit]


def candidate_at(
    target: Target,
    elements: Sequence[Mapping[str, Any]],
    number: int,
    reason: str,
    *,
    interactive_only: bool = True,
) -> Candidate | None:
    """Element ``number`` of ``elements`` as a candidate for ``target``, proposed for ``reason``
    (None when no element has that number, or it cannot stand for the target: no role and name
    to be found by, not interactive for a step that acts, in another frame)."""
    element = next((e for e in elements if e.get("number") == number), None)
    if element is None or not _eligible(element, target, interactive_only=interactive_only):
        return None
    role, name = str(element.get("role") or ""), _name_of(element)
    if not (role and name):
        return None
    frame, named = str(element.get("frame") or ""), named_elements(elements)
    pinned, _, _ = _pinned(target, element, frame, named)
    return Candidate(
        number=number,
        role=role,
        name=name,
        box=element.get("box"),
        target=pinned,
        score=1.0,
        reasons=(reason,),
        matches=len(found_by(pinned, frame, named)),
    )


def absent_from(target: Target, elements: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a page (``elements``, an observation's) plainly has nothing ``target`` names: no
    element of its role (or a field's role, for a label or placeholder) with its name. False
    when that cannot be told from the observation (CSS, a test id, text, ``{{ … }}``)."""
    wanted = target.readable_name.casefold()
    if not wanted or TEMPLATE.search(wanted) or target.kind not in ("role", "label", "placeholder"):
        return False
    roles = _roles_meant(target)
    exact = target.exact
    for element in elements:
        name = _name_of(element).casefold()
        if element.get("role") in roles and (name == wanted if exact else wanted in name):
            return False
    return True


def place_of(target: Target, elements: Sequence[Mapping[str, Any]], seen: str) -> Place | None:
    """Where ``target``'s element is among ``elements`` (a page the step acted on), or None when
    no element has its role (or a field's role) and its exact name."""
    wanted = target.readable_name.casefold()
    if TEMPLATE.search(wanted):
        return None
    roles = _roles_meant(target)
    per_role: dict[str, int] = {}
    for element in elements:
        role = str(element.get("role") or "")
        ordinal = per_role.get(role, 0)
        per_role[role] = ordinal + 1
        name = " ".join(str(element.get("name") or "").split()).casefold()
        if wanted and role in roles and name == wanted:
            return Place(role=role, ordinal=ordinal, seen=seen)
    return None


def _ordinal(number: int) -> str:
    suffix = (
        "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    )
    return f"{number}{suffix}"


def _name_of(element: Mapping[str, Any]) -> str:
    return " ".join(str(element.get("name") or "").split())


def _eligible(element: Mapping[str, Any], target: Target, *, interactive_only: bool) -> bool:
    # A target in a frame names its frames; one on the page names none: each stays where it was.
    same_frame = bool(element.get("frame")) == bool(target.frame)
    return same_frame and (element.get("interactive") is True or not interactive_only)


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


def named_elements(elements: Sequence[Mapping[str, Any]]) -> Named:
    """The named elements of an observation by frame and name, in document order: what a target
    by role and name, or by text, picks from."""
    named: Named = {}
    for element in elements:
        name = _name_of(element)
        if name:
            named.setdefault((str(element.get("frame") or ""), name), []).append(element)
    return named


def found_by(target: Target, frame: str, named: Named) -> list[Mapping[str, Any]]:
    """The elements of ``frame`` an exact role-and-name or text target (what ``_target_for``
    writes) finds on the observed page: those of its role and name, or of its text whatever
    their role (an observation records accessible names, the nearest it holds to an element's
    text), then its ``nth``, counted as Playwright counts it, among all of them."""
    wanted = (target.name if target.role else target.text) or ""
    found = named.get((frame, wanted), [])
    if target.role:
        found = [e for e in found if e.get("role") == target.role]
    return found if target.nth is None else found[target.nth : target.nth + 1]


def _pinned(
    original: Target, element: Mapping[str, Any], frame: str, named: Named
) -> tuple[Target, int, int]:
    """The target that finds ``element`` and only it, its place among the elements its role and
    name (or its text) find, and how many those are. The place counts every such element,
    including those no candidate stands for (not interactive, say): the runner's locator sees
    them all."""
    role, name = str(element.get("role") or ""), _name_of(element)
    loose = _target_for(original, role, name, None)
    alike = found_by(loose, frame, named)
    place = next(i for i, e in enumerate(alike) if e is element)
    if len(alike) == 1:
        return loose, place, 1
    return _target_for(original, role, name, place), place, len(alike)


def _target_for(original: Target, role: str, name: str, nth: int | None) -> Target:
    """The target that finds this element: by role and accessible name (what the observation
    records; a field's accessible name may come from its label, its placeholder or its title,
    so a label or placeholder target could miss it), by text otherwise; ``nth`` only when the
    name is not enough, in the original's frames."""
    frame = list(original.frame)
    if role in ARIA_ROLES:
        return Target(role=role, name=name, exact=True, nth=nth, frame=frame)
    return Target(text=name, exact=True, nth=nth, frame=frame)
