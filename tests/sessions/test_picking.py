"""Targets proposed for an element a person points at, tried on a real page with the runner's
own locators: the best first, each with how many elements it finds now."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page

from sessions.engine import locating
from sessions.engine.picking import PickFailed, pick
from sessions.engine.steps.language import Target

pytestmark = pytest.mark.browser

PAGE = """
<main>
  <button>Pay now</button>
  <label for="amount">Amount</label><input id="amount" placeholder="0.00">
  <ul>
    <li>Invoice 1 <button>View</button></li>
    <li>Invoice 2 <button>View</button></li>
    <li>Invoice 3 <button>View</button></li>
  </ul>
  <div role="button" tabindex="0" data-testid="export">Export</div>
  <button hidden>Hidden</button>
</main>
"""


class _Runner:
    """What ``locating.locate`` asks of the runner: references written literally."""

    page: Page

    def text(self, template: str) -> str:
        return template


def element(page: Page, role: str, name: str, nth: int = 0) -> dict[str, Any]:
    box = page.get_by_role(role, name=name, exact=True).nth(nth).bounding_box()  # type: ignore[arg-type]
    return {"role": role, "name": name, "box": box, "number": 1}


def proposals(page: Page, picked: dict[str, Any]) -> list[tuple[str, str, int]]:
    runner = _Runner()
    runner.page = page
    found = pick(
        page,
        picked,
        lambda p, target: locating.locate(runner, p, target, strict=False),  # type: ignore[arg-type]
    )
    return [(p.kind, p.target.to_compact(), p.matches) for p in found.proposals]


def test_a_unique_button_is_found_by_role_and_name_first_and_css_last(page: Page) -> None:
    page.set_content(PAGE)

    found = proposals(page, element(page, "button", "Pay now"))

    assert found[0] == ("role", "button 'Pay now' exact", 1)
    assert found[1] == ("text", "text 'Pay now' exact", 1)
    assert found[-1][0] == "css"


def test_a_field_is_found_by_its_label_and_its_placeholder(page: Page) -> None:
    page.set_content(PAGE)

    found = proposals(page, element(page, "textbox", "Amount"))

    assert [kind for kind, _, _ in found][:3] == ["role", "label", "placeholder"]
    assert all(matches == 1 for _, _, matches in found)


def test_one_of_many_alike_is_offered_with_its_place_after_the_unique_ways(page: Page) -> None:
    page.set_content(PAGE)

    found = proposals(page, element(page, "button", "View", nth=1))

    role = next(p for p in found if p[0] == "role")
    assert role == ("role", "button View exact nth=1", 3)
    unique = [p for p in found if p[2] == 1]
    assert unique
    assert found.index(unique[-1]) < found.index(role)
    assert Target.from_compact(role[1]).nth == 1


def test_a_test_id_is_proposed_and_a_hidden_or_framed_element_is_refused(page: Page) -> None:
    page.set_content(PAGE)

    found = proposals(page, element(page, "button", "Export"))
    assert ("test_id", "testid export", 1) in found

    with pytest.raises(PickFailed, match="hidden"):
        proposals(page, {"role": "button", "name": "Hidden", "box": None})
    with pytest.raises(PickFailed, match="inside a frame"):
        proposals(page, {"role": "button", "name": "x", "box": {}, "frame": "iframe#pay"})
