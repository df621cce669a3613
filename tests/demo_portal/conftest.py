from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from pandaweb.demo_portal.server import PortalServer, make_server
from pandaweb.demo_portal.state import DEMO_PASSWORD, DEMO_USERNAME


@pytest.fixture
def portal_server() -> Iterator[PortalServer]:
    """A portal with fresh state on a free loopback port, served from a daemon thread."""
    server = make_server("127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture
def portal(portal_server: PortalServer) -> str:
    """The base URL of a running portal, without trailing slash."""
    return f"http://127.0.0.1:{portal_server.server_port}"


def fetch_json(url: str, *, method: str = "GET") -> Any:
    """Ask the portal directly, not through the browser under test."""
    data = b"" if method == "POST" else None
    request = urllib.request.Request(url, data=data, method=method)  # noqa: S310 - test URL
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - test URL
        return json.load(response)


def sign_in(page: Page, portal: str, *, accept_cookies: bool = True) -> None:
    page.goto(f"{portal}/login")
    page.get_by_label("Username").fill(DEMO_USERNAME)
    page.get_by_label("Password").fill(DEMO_PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Welcome back, Dana Fischer")).to_be_visible()
    if accept_cookies:
        page.get_by_role("button", name="Accept").click()
        expect(page.get_by_text("We use cookies")).to_be_hidden()
