from __future__ import annotations

import json
import urllib.request
from typing import Any

from playwright.sync_api import Page, expect

from pandaweb.demo_portal.state import DEMO_PASSWORD, DEMO_USERNAME


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
