"""Healing candidates for a target that no longer matches, from a failed step's observation."""

from __future__ import annotations

from typing import Any

from sessions.engine.healing import (
    Place,
    candidate_at,
    found_by,
    heal_candidates,
    named_elements,
    place_of,
)
from sessions.engine.steps.language import Target


def element(number: int, role: str, name: str) -> dict[str, Any]:
    box = {"x": 10.0 * number, "y": 20.0, "width": 80.0, "height": 24.0}
    return {"number": number, "role": role, "name": name, "box": box, "interactive": True}


PAGE = [
    element(1, "heading", "Invoice INV-1040"),
    element(2, "textbox", "IBAN (international)"),
    element(3, "button", "Cancel"),
    element(4, "button", "Submit the payment"),
    element(5, "link", "Payment terms"),
]


def test_a_renamed_button_is_proposed_first_with_the_reasons_in_words() -> None:
    found = heal_candidates(Target(role="button", name="Submit payment"), PAGE)

    best = found[0]
    assert (best.number, best.target) == (
        4,
        Target(role="button", name="Submit the payment", exact=True),
    )
    assert best.matches == 1
    assert best.reasons[0] == "the same kind of element (button)"
    assert any("% like 'Submit payment'" in reason for reason in best.reasons)
    assert "its name shares 'payment', 'submit'" in best.reasons
    # A button of another name is no candidate: the kind of element alone is not enough.
    assert 3 not in [c.number for c in found]


def test_a_renamed_label_is_found_by_the_field_s_role_and_accessible_name() -> None:
    [best, *_] = heal_candidates(Target(label="IBAN"), PAGE)

    # The accessible name may come from a label, a placeholder or a title: role and name find
    # the field whichever it was.
    assert best.target == Target(role="textbox", name="IBAN (international)", exact=True)
    assert "the same kind of element (textbox)" in best.reasons


def test_a_target_written_with_references_is_not_pinned_to_one_run_s_values() -> None:
    page = [element(1, "link", "Pay INV-1001 now")]

    assert heal_candidates(Target(role="link", name="Pay {{ params.invoice }}"), page) == []


def test_what_a_step_acts_on_is_interactive_and_in_the_frame_its_target_names() -> None:
    heading = {**element(1, "heading", "Submit payment"), "interactive": False}
    framed = {**element(2, "button", "Submit payment"), "frame": "iframe#pay"}
    page = [heading, framed, element(3, "button", "Submit the payment")]

    on_page = heal_candidates(Target(role="button", name="Submit payment"), page)
    in_frame = heal_candidates(
        Target(role="button", name="Submit payments", frame=["iframe#pay"]), page
    )
    read_only = heal_candidates(Target(text="Submit payment"), page, interactive_only=False)

    assert [c.number for c in on_page] == [3]
    assert [(c.number, c.target.frame) for c in in_frame] == [(2, ["iframe#pay"])]
    assert 1 in [c.number for c in read_only]


def test_two_elements_with_one_name_are_told_apart_by_their_place() -> None:
    page = [element(1, "button", "Pay"), element(2, "button", "Pay"), element(3, "link", "Help")]

    found = heal_candidates(Target(role="button", name="Pay invoice"), page)

    assert [c.target.nth for c in found] == [0, 1]
    assert "number 2 of 2 elements with this name" in found[1].reasons
    assert all(c.matches == 1 for c in found)


def test_an_element_no_candidate_stands_for_still_counts_in_the_target_s_place() -> None:
    # A button the step cannot act on (not interactive) shares the name: the runner's locator
    # finds it too, so the interactive one is the second of two.
    shown = {**element(1, "button", "Pay"), "interactive": False}
    page = [shown, element(2, "button", "Pay")]

    [candidate] = heal_candidates(Target(role="button", name="Pay now"), page)

    assert candidate.number == 2
    assert candidate.target == Target(role="button", name="Pay", exact=True, nth=1)
    assert "number 2 of 2 elements with this name" in candidate.reasons
    assert candidate.matches == 1


def test_a_text_target_counts_every_element_of_that_name_whatever_its_role() -> None:
    # A role people do not target becomes a text target, which finds the heading of the same
    # words as well.
    page = [element(1, "heading", "Archive"), element(2, "menuitemcheckbox", "Archive")]

    chosen = candidate_at(Target(text="Archiv"), page, 2, "chosen", interactive_only=False)

    assert chosen is not None
    assert chosen.target == Target(text="Archive", exact=True, nth=1)
    assert chosen.matches == 1


def test_what_a_target_finds_is_counted_on_the_observed_page_frame_by_frame() -> None:
    framed = {**element(5, "button", "Pay"), "frame": "iframe#pay"}
    page = [
        element(1, "button", "Pay"),
        element(2, "link", "Pay"),
        element(3, "button", "Pay"),
        element(4, "button", "Pay later"),
        framed,
    ]
    named = named_elements(page)

    def count(target: Target, frame: str = "") -> int:
        return len(found_by(target, frame, named))

    assert count(Target(role="button", name="Pay", exact=True)) == 2
    assert count(Target(role="button", name="Pay", exact=True, nth=1)) == 1
    assert count(Target(role="button", name="Pay", exact=True, nth=2)) == 0
    assert count(Target(text="Pay", exact=True)) == 3
    assert count(Target(role="button", name="Pay", exact=True), "iframe#pay") == 1
    # What each candidate shows: the count for its own target, one when it is pinned.
    found = heal_candidates(Target(role="button", name="Pay it"), page)
    assert {c.number: (c.target.nth, c.matches) for c in found} == {
        1: (0, 1),
        2: (None, 1),
        3: (1, 1),
        4: (None, 1),
    }


def test_a_page_with_nothing_alike_proposes_nothing() -> None:
    page = [element(1, "link", "Home"), element(2, "heading", "Welcome")]

    assert heal_candidates(Target(role="button", name="Submit payment"), page) == []


def test_unnamed_elements_are_never_proposed() -> None:
    page = [element(1, "button", ""), {"number": 2, "role": "button", "name": None}]

    assert heal_candidates(Target(role="button", name="Submit"), page) == []


def test_a_button_renamed_beyond_recognition_is_found_in_the_place_it_had() -> None:
    before = [element(1, "button", "Back"), element(2, "button", "Submit"), element(3, "link", "?")]
    after = [element(1, "button", "Back"), element(2, "button", "Send"), element(3, "link", "?")]
    target = Target(role="button", name="Submit")

    was = place_of(target, before, "when run #7 passed")
    found = heal_candidates(target, after, was=was)

    assert was == Place(role="button", ordinal=1, seen="when run #7 passed")
    assert [(c.number, c.target) for c in found] == [
        (2, Target(role="button", name="Send", exact=True))
    ]
    assert found[0].reasons[-1] == "where the button was when run #7 passed (2nd button)"
    # Without the place, nothing in "Send" says it is "Submit".
    assert heal_candidates(target, after) == []
