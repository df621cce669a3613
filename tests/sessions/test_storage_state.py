"""Loading a session template's storage state into a browser context (real Chromium)."""

from __future__ import annotations

import logging

import pytest
from playwright.sync_api import Browser

from pandaweb.demo_portal.server import PortalServer
from pandaweb.demo_portal.state import DEMO_USERNAME
from sessions.engine.runner import _load_storage_state

pytestmark = pytest.mark.browser


def test_a_storage_state_is_restored_without_asking_the_portal(
    browser: Browser, portal: str, portal_server: PortalServer, caplog: pytest.LogCaptureFixture
) -> None:
    host = portal.removeprefix("http://").split(":")[0]
    token = portal_server.state.open_session(DEMO_USERNAME)
    state = {
        "cookies": [{"name": "acme_session", "value": token, "domain": host, "path": "/",
                     "expires": -1, "httpOnly": True, "secure": False, "sameSite": "Lax"}],
        "origins": [{"origin": portal, "localStorage": [{"name": "layout", "value": "compact"}]}],
    }  # fmt: skip
    context = browser.new_context()
    try:
        with caplog.at_level(logging.INFO, logger="pandaweb.demo_portal.server"):
            _load_storage_state(context, state)
        assert [r.getMessage() for r in caplog.records] == []
        page = context.new_page()
        page.goto(f"{portal}/")

        assert page.evaluate("() => localStorage.getItem('layout')") == "compact"
        assert page.get_by_role("button", name="Log out").count() == 1
        assert context.pages == [page]
    finally:
        context.close()
