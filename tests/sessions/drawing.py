"""Tests that drive a sandbox's browser with Playwright directly connect as the product's driver
does: with the frame pump that a browser drawing only on request needs (``sessions.engine.frames``;
without it a click waits for ever for the page to be "stable")."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import Browser, Playwright

from sessions.engine.frames import FramePump


def connect_drawing(playwright: Playwright, cdp_url: str, **options: Any) -> Browser:
    """``connect_over_cdp`` with a frame pump for as long as the connection lasts."""
    pump = FramePump.open(cdp_url, time_scale=options.get("timeout", 15_000) / 15_000)
    try:
        browser = playwright.chromium.connect_over_cdp(cdp_url, **options)
    except BaseException:
        if pump is not None:
            pump.close()
        raise
    if pump is not None:
        browser.on("disconnected", lambda _: pump.close())
    return browser
