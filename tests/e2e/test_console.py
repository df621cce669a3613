from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from pandaweb.core.roles import Role
from tests.e2e.conftest import Stack
from tests.e2e.test_dashboard import log_in

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


@pytest.fixture(scope="module")
def seeded(live_stack: Stack) -> Stack:
    stack = live_stack
    stack.manage("seed_runs", "--runs", "120", "--steps", "2", "--days", "3")
    return stack


def test_the_runs_list_filters_live_and_keeps_the_filters_in_the_address(
    page: Page, seeded: Stack
) -> None:
    log_in(page, seeded, Role.OPERATORS)
    page.goto(f"{seeded.url}/runs/")
    expect(page.locator("tbody tr")).to_have_count(50)

    page.get_by_label("Status").select_option("failed")
    page.wait_for_url(re.compile(r"status=failed"))
    expect(page.locator("tbody tr").first).to_contain_text("Failed")
    expect(page.locator("tbody tr", has_text="Succeeded")).to_have_count(0)

    page.get_by_role("link", name="Steps").click()
    page.wait_for_url(re.compile(r"status=failed&sort=-steps"))
    page.reload()  # the address alone brings the same view back
    expect(page.get_by_label("Status")).to_have_value("failed")
    expect(page.locator("th[aria-sort=descending]")).to_have_text("Steps")

    page.get_by_label("Status").select_option("")
    page.get_by_label("Search").fill("inv-2026007")
    page.wait_for_url(re.compile(r"\?q=inv-2026007&sort=-steps$"))
    expect(page.locator("tbody tr[id^=run-]")).to_have_count(1)


def test_the_console_pages_fit_a_phone_and_work_from_the_keyboard(
    page: Page, seeded: Stack
) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, seeded, Role.OPERATORS)
    for path in ("/", "/runs/", "/runs/failures/"):
        page.goto(f"{seeded.url}{path}")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, (path, width)

    page.goto(f"{seeded.url}/runs/")
    page.keyboard.press("Tab")
    expect(page.locator(":focus")).to_have_text("Skip to content")
    page.keyboard.press("Enter")
    for _ in range(40):
        page.keyboard.press("Tab")
        if page.locator(":focus").get_attribute("name") == "q":
            break
    expect(page.locator(":focus")).to_have_attribute("name", "q")
