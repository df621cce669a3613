"""The approval gate in front of an irreversible step: the evidence a reviewer decides on (the
address, the target's identity, what this run typed, the page's text and its picture), and
whether an approval still holds when the run comes back to act."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

from playwright.sync_api import Error as PlaywrightError

from sessions.engine import facts as decision_facts
from sessions.engine import observation as observing
from sessions.engine import wording
from sessions.engine.plan import Gate
from sessions.engine.steps.base import StepBase
from sessions.engine.steps.click import ClickStep
from sessions.engine.steps.language import Target
from workflows.schema import describe_step

if TYPE_CHECKING:
    from sessions.engine.runner import Runner

PAGE_TEXT_LIMIT = 10_000


# Who the target of a gated action is, beyond its accessible name: compared before acting.
_TARGET_IDENTITY = """e => ({
  tag: e.tagName.toLowerCase(),
  id: e.id || '',
  name: e.getAttribute('name') || '',
  type: e.getAttribute('type') || '',
  text: (e.innerText || e.value || '').trim().slice(0, 200),
  form_action: e.form ? (e.form.getAttribute('action') || '') : '',
})"""

_TARGET_CONTEXT = (
    "xpath=ancestor::*[self::dialog or @role='dialog' or @role='alertdialog' or self::form "
    "or self::fieldset][1]"
)

# The approval gate -----------------------------------------------------------------------


def gate(runner: Runner, index: int, step: StepBase) -> Gate | None:
    """The gate in front of irreversible step ``index``, or None when it may act now: it was
    approved and the page still shows what the reviewers saw."""
    approved = runner.plan.approved_evidence
    if index != runner.plan.approved_index or approved is None:
        evidence, screenshot = gate_evidence(runner, index, step)
        return Gate.of(evidence, screenshot)
    # Everything evidence_changes compares, read without the pictures and the observation:
    # those are for a new request only, and the reviewer is waiting for the action.
    current = compared_evidence(runner, step, waiting=False)
    if current is not None and not evidence_changes(approved, current):
        return None
    evidence, screenshot = gate_evidence(runner, index, step)
    changes = evidence_changes(approved, evidence)
    if changes:
        return Gate.of(evidence, screenshot, tuple(changes))
    return None


def compared_evidence(runner: Runner, step: StepBase, *, waiting: bool) -> dict[str, Any] | None:
    """The evidence that decides whether an approval still holds: the address, the target's
    identity, the values this run typed that are still on the page, the page's text.

    ``waiting=False`` reads what is there now and returns None when the target does not
    match exactly one element (the full evidence then waits, or says why it cannot)."""
    page = runner.page
    page.wait_for_load_state("domcontentloaded", timeout=runner._scaled(5_000))
    target: dict[str, Any] | None = None
    targets = step.targets()
    if targets:
        located = runner.locate(page, targets[0])
        # One round trip for every match: a strict locator's evaluate first waits for its
        # element through several more.
        found = located.evaluate_all(f"elements => elements.map({_TARGET_IDENTITY})")
        if len(found) == 1:
            identity = found[0]
        elif waiting:
            identity = located.evaluate(_TARGET_IDENTITY, timeout=runner._scaled(5_000))
        else:
            return None
        target = {
            "description": runner.words(targets[0].describe()),
            **{key: wording.scrub(runner, str(value)) for key, value in identity.items()},
        }
    text = page.evaluate("() => document.body ? document.body.innerText : ''")
    url = wording.scrub(runner, page.url)
    filled = []
    for entry in runner.filled:
        entry = dict(entry)
        entry.pop("on_page", None)
        if entry["url"] == page.url and not entry["secret"]:
            # A form posted to its own address leaves the URL as it was: the field may be
            # gone, which is no reason to wait for it.
            field = runner.locate(page, Target.model_validate(entry["target"]), strict=False)
            try:
                entry["on_page"] = (
                    field.first.input_value(timeout=runner._scaled(1_000))
                    if field.count()
                    else None
                )
            except PlaywrightError:
                entry["on_page"] = None
        filled.append(entry)
    return {
        "url": url,
        "target": target,
        "filled": filled,
        "page_text": wording.scrub(runner, " ".join(str(text).split()))[:PAGE_TEXT_LIMIT],
    }


def gate_evidence(runner: Runner, index: int, step: StepBase) -> tuple[dict[str, Any], bytes]:
    compared = compared_evidence(runner, step, waiting=True)
    assert compared is not None  # a waiting read raises rather than give up
    page = runner.page
    seen = observing.capture(page, secret_values=runner.secret_values)
    targets = step.targets()
    if compared["target"] is not None:
        located = runner.locate(page, targets[0])
        compared["target"]["box"] = located.bounding_box(timeout=runner._scaled(5_000))
        # The dialog or form around it: the reviewer's close-up keeps its words in.
        context = located.locator(_TARGET_CONTEXT)
        if context.count():
            compared["target"]["context_box"] = context.first.bounding_box(
                timeout=runner._scaled(5_000)
            )
    # Lossless: this picture is what a person signs off on.
    screenshot = page.screenshot(
        type="png", mask=seen.masks or None, caret="initial", timeout=runner._scaled(10_000)
    )
    evidence = {
        "step_index": index,
        "step_id": step.id,
        **compared,
        "action": runner.words(
            f"{describe_step(step).removesuffix(' — irreversible')} on {compared['url']}"
        ),
        # What the runner waits for before calling the action done (and what it does with a
        # confirm() the click opens): reviewers approve the action with its success test.
        "expect": runner._expect_words(step.expect) if step.expect else "",
        "dialog": step.dialog or "" if isinstance(step, ClickStep) else "",
        "title": seen.observation.title,
        "inputs": dict(runner.plan.inputs),
        "outputs": {key: wording.plain(value) for key, value in runner.outputs.items()},
        "observation": seen.observation.to_dict(),
    }
    if runner.plan.facts:
        evidence["facts"] = decision_facts.read_facts(runner, compared["page_text"])
    if runner._operators:
        evidence["operators"] = list(runner._operators)
    return evidence, screenshot


def gate_reason(index: int, step: StepBase, gate: Gate) -> str:
    if gate.changes:
        return f"step {index + 1} '{step.id}': the page changed since it was approved"
    return f"step {index + 1} '{step.id}' is irreversible and needs approval"


def evidence_changes(approved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between the evidence a person approved and the page now, in words."""
    changes = []
    if approved.get("url") != current.get("url"):
        changes.append(f"the address changed: {approved.get('url')} → {current.get('url')}")
    old_target, new_target = approved.get("target") or {}, current.get("target") or {}
    for key in ("description", "tag", "id", "name", "type", "text", "form_action"):
        if old_target.get(key) != new_target.get(key):
            changes.append(
                f"the target's {key} changed: {old_target.get(key)!r} → {new_target.get(key)!r}"
            )
    old_fields = {entry["step_id"]: entry for entry in approved.get("filled", [])}
    for entry in current.get("filled", []):
        before = old_fields.get(entry["step_id"], {})
        if before.get("on_page") != entry.get("on_page"):
            changes.append(
                f"{entry['field']} now holds {entry.get('on_page')!r}, "
                f"not {before.get('on_page')!r}"
            )
    if approved.get("page_text") != current.get("page_text"):
        changes.append(f"the page's text changed: {_text_change(approved, current)}")
    return changes


def _text_change(approved: dict[str, Any], current: dict[str, Any]) -> str:

    old_words = str(approved.get("page_text", "")).split()
    new_words = str(current.get("page_text", "")).split()
    matcher = difflib.SequenceMatcher(a=old_words, b=new_words, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            return f"'{' '.join(old_words[i1:i2])[:80]}' → '{' '.join(new_words[j1:j2])[:80]}'"
    return "(whitespace only)"
