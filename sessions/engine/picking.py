"""Targets for an element a person pointed at on a live page, best first.

In a scratch session a person clicks an element of the page's picture; the element is the
observation's (its number, role, name and box). Here, on the live page, every way of writing a
target for it is tried with the same locators the runner uses: role and accessible name first,
then label, placeholder, text, test id, CSS last. Each proposal says how many elements it matches
right now; one that does not find the element pointed at is left out, and one that finds several
is offered with ``nth`` as a last resort. No Django.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page

from sessions.engine.steps.language import ARIA_ROLES, Target

# How each way of finding an element is said, in the order a person should prefer it: what a
# person reads on the page outlives a redesign; a test id outlives a rename; CSS outlives neither.
PREFERENCE = ("role", "label", "placeholder", "text", "test_id", "css")
KIND_WORDS = {
    "role": "its role and name",
    "label": "its label",
    "placeholder": "its placeholder",
    "text": "its text",
    "test_id": "its test id",
    "css": "a CSS selector",
}
# Texts longer than this make brittle targets: a paragraph changes with every edit.
MAX_TEXT = 80

_FIND_JS = """
([x, y]) => {
  const e = document.elementFromPoint(x, y);
  return e && (e.closest("a,button,input,select,textarea,summary,label,[role],[tabindex],"
    + "[data-testid],[contenteditable]") || e);
}
"""
_FACTS_JS = """
e => {
  const words = s => (s || "").replace(/\\s+/g, " ").trim();
  const labels = e.labels ? [...e.labels].map(l => words(l.textContent)).filter(Boolean) : [];
  const step = n => {
    // Generated ids (with long numbers in them) change from one page load to the next.
    if (n.id && !/\\d{3,}/.test(n.id)) return "#" + CSS.escape(n.id);
    const same = n.parentElement
      ? [...n.parentElement.children].filter(c => c.localName === n.localName) : [];
    return same.length > 1
      ? `${n.localName}:nth-of-type(${same.indexOf(n) + 1})` : n.localName;
  };
  const path = [];
  for (let n = e; n && n.nodeType === 1 && path.length < 5; n = n.parentElement) {
    const part = step(n);
    path.unshift(part);
    if (part.startsWith("#") || n.localName === "body") break;
  }
  return {
    label: labels[0] || "",
    placeholder: words(e.getAttribute("placeholder")),
    text: ["input", "select", "textarea"].includes(e.localName) ? "" : words(e.innerText),
    test_id: words(e.getAttribute("data-testid")),
    css: path.join(" > "),
    // What a password manager would fill: typed from a credential, never from the workflow.
    secret: e.localName === "input" && (e.type === "password"
      || /one-time-code|current-password|new-password/.test(e.autocomplete || "")),
  };
}
"""
_COUNT_JS = "(found, element) => [found.length, found.indexOf(element)]"


class PickFailed(Exception):
    """Nothing can be proposed for the point; the message is for people."""


@dataclass(frozen=True)
class Proposal:
    """A target for the element pointed at, and what it finds on the page now."""

    target: Target
    kind: str
    # How many elements the target finds now (with ``nth``: how many it picks among).
    matches: int

    @property
    def words(self) -> str:
        found = (
            "only this element"
            if self.matches == 1
            else f"{self.matches} elements: this one is number {(self.target.nth or 0) + 1}"
        )
        return f"by {KIND_WORDS[self.kind]}, finds {found}"


@dataclass(frozen=True)
class Picked:
    """The targets proposed for the element pointed at, and whether it takes a secret."""

    proposals: list[Proposal]
    secret: bool


def pick(page: Page, element: Mapping[str, Any], locate: Any, *, limit: int = 6) -> Picked:
    """Proposals for ``element`` (an observation element, with its ``box`` in the page's
    viewport pixels) on ``page``, best first. ``locate(page, target)`` is the runner's locator
    (non-strict). Raises PickFailed in people's words."""
    if element.get("frame"):
        raise PickFailed(
            "the element is inside a frame: write its target by hand, with the frame's selector"
        )
    box = element.get("box")
    if not box:
        raise PickFailed("the element has no place on the page (it is hidden)")
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    try:
        found = page.evaluate_handle(_FIND_JS, [x, y]).as_element()
        if found is None:
            raise PickFailed("no element is at that place on the page now")
        facts = found.evaluate(_FACTS_JS)
        proposals = []
        for kind, target in _targets(element, {k: facts.get(k) or "" for k in PREFERENCE[1:]}):
            count, index = locate(page, target).evaluate_all(_COUNT_JS, found)
            if index < 0:
                continue
            if count > 1:
                target = target.model_copy(update={"nth": index})
            proposals.append(Proposal(target=target, kind=kind, matches=count))
        found.dispose()
    except PlaywrightError as exc:
        first_line = str(exc).splitlines()[0]
        raise PickFailed(f"the page changed while it was read: {first_line}") from None
    proposals.sort(key=lambda p: (p.matches != 1, PREFERENCE.index(p.kind)))
    return Picked(proposals=proposals[:limit], secret=bool(facts.get("secret")))


def _targets(element: Mapping[str, Any], facts: Mapping[str, str]) -> list[tuple[str, Target]]:
    role = str(element.get("role") or "")
    name = " ".join(str(element.get("name") or "").split())
    found: list[tuple[str, Target]] = []
    if role in ARIA_ROLES and name:
        found.append(("role", Target(role=role, name=name, exact=True)))
    if facts["label"]:
        found.append(("label", Target(label=facts["label"], exact=True)))
    if facts["placeholder"]:
        found.append(("placeholder", Target(placeholder=facts["placeholder"], exact=True)))
    if facts["text"] and len(facts["text"]) <= MAX_TEXT:
        found.append(("text", Target(text=facts["text"], exact=True)))
    if facts["test_id"]:
        found.append(("test_id", Target(test_id=facts["test_id"])))
    if facts["css"]:
        found.append(("css", Target(css=facts["css"])))
    return found
