"""The audit page in a real browser on a real installation: what is exported is what is shown."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from pandaweb.core.roles import DEMO_USERS, Role
from tests.e2e.conftest import Stack
from tests.e2e.test_dashboard import log_in

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


def export(page: Page, tmp_path: Path, name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Click "Export the matching events"; the downloaded zip's manifest and events."""
    with page.expect_download() as waiting:
        page.get_by_role("button", name="Export the matching events").click()
    target = tmp_path / name
    waiting.value.save_as(target)
    with zipfile.ZipFile(target) as archive:
        manifest = json.loads(archive.read("manifest.json"))
        events = [json.loads(line) for line in archive.read("events.jsonl").splitlines()]
    return manifest, events


def listed(page: Page) -> list[int]:
    return [int(s) for s in page.locator("#audit-table td.audit-seq").all_inner_texts()]


def test_the_export_holds_exactly_the_events_the_filters_on_screen_select(
    page: Page, stack: Stack, tmp_path: Path
) -> None:
    username = DEMO_USERS[Role.COMPLIANCE]
    log_in(page, stack, Role.COMPLIANCE)
    page.goto(f"{stack.url}/audit/")
    first_page = listed(page)

    # Filtering goes through htmx on change: the list and the address change, the page does not
    # reload, and each change is a step of its own in the history (one change at a time here:
    # a change made while the previous one's request is in flight replaces that request).
    page.get_by_label("Action").fill("auth.logged_in")
    page.get_by_label("Action").press("Tab")
    expect(page).to_have_url(re.compile(r"/audit/\?.*\baction=auth\.logged_in(&|$)"))
    page.get_by_label("Actor").fill(username)
    page.get_by_label("Actor").press("Tab")
    expect(page).to_have_url(
        re.compile(rf"/audit/\?(?=.*\baction=auth\.logged_in(&|$))(?=.*\bactor={username}(&|$))")
    )
    expect(page.get_by_test_id("export-scope")).to_contain_text(username)
    shown = listed(page)
    assert shown
    assert set(shown) < set(first_page)

    manifest, events = export(page, tmp_path, "filtered.zip")

    assert sorted(e["sequence"] for e in events) == sorted(shown)
    assert {(e["action"], e["actor_label"]) for e in events} == {("auth.logged_in", username)}
    assert manifest["count"] == len(shown)
    assert {k: v for k, v in manifest["filter"].items() if k != "up_to_sequence"} == {
        "action": "auth.logged_in",
        "actor": username,
    }
    # The page says what the export will hold.
    expect(page.get_by_test_id("export-scope")).to_contain_text(username)

    # Back: each filter change was a step of its own (htmx filters on change), and the export
    # follows what is on screen at each of them.
    page.go_back()
    expect(page).to_have_url(re.compile(r"/audit/\?.*\baction=auth\.logged_in(&|$)"))
    expect(page.get_by_label("Actor")).to_have_value("")
    manifest, events = export(page, tmp_path, "action-only.zip")
    assert {k: v for k, v in manifest["filter"].items() if k != "up_to_sequence"} == {
        "action": "auth.logged_in"
    }
    assert {e["action"] for e in events} == {"auth.logged_in"}
    assert sorted(e["sequence"] for e in events) == sorted(listed(page))

    page.go_back()
    expect(page).to_have_url(f"{stack.url}/audit/")
    expect(page.get_by_label("Action")).to_have_value("")
    manifest, events = export(page, tmp_path, "all.zip")
    assert set(manifest["filter"]) == {"up_to_sequence"}
    assert {e["sequence"] for e in events} >= set(first_page)
    expect(page.get_by_test_id("export-scope")).to_contain_text("the whole trail")

    # And forward to where the filters were.
    page.go_forward()
    expect(page.get_by_label("Action")).to_have_value("auth.logged_in")
    page.go_forward()
    expect(page.get_by_label("Actor")).to_have_value(username)
    expect(page.get_by_label("Action")).to_have_value("auth.logged_in")
    manifest, events = export(page, tmp_path, "forward.zip")
    assert sorted(e["sequence"] for e in events) == sorted(shown)
