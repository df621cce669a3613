"""Warm Playwright drivers for the runner (no Django imports).

Starting Playwright's driver (a Node.js process) takes most of a second; a run that continues after
an approval would pay it again just to click one button. So each thread of a small pool keeps one
driver for the life of the process and the runner's browser work is handed to that pool.

The work runs on the pool's threads, never on the caller's: a sync Playwright keeps an asyncio
loop running on its thread, where Django refuses database calls, and the caller (a task) needs
those.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from playwright.sync_api import Browser, Playwright, sync_playwright
from playwright.sync_api import Error as PlaywrightError

T = TypeVar("T")

# More threads than a worker runs browsers at once; idle ones cost one idle driver each.
_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="playwright")
_local = threading.local()


def _driver(*, fresh: bool = False) -> Playwright:
    playwright: Playwright | None = getattr(_local, "playwright", None)
    if playwright is not None and fresh:
        # A dead driver cannot be stopped politely.
        with contextlib.suppress(Exception):
            playwright.stop()
        playwright = None
    if playwright is None:
        playwright = sync_playwright().start()
        _local.playwright = playwright
    return playwright


def _connect(cdp_url: str, artifacts_dir: str | None) -> Browser:
    try:
        return _driver().chromium.connect_over_cdp(
            cdp_url, timeout=15_000, artifacts_dir=artifacts_dir
        )
    except PlaywrightError as exc:
        # A driver that died since its last use says so on first contact; start another once.
        if "closed" not in str(exc).lower() and "connection" not in str(exc).lower():
            raise
        return _driver(fresh=True).chromium.connect_over_cdp(
            cdp_url, timeout=15_000, artifacts_dir=artifacts_dir
        )


def with_browser(
    cdp_url: str, work: Callable[[Browser], T], *, artifacts_dir: str | None = None
) -> T:
    """Connect to the browser at ``cdp_url``, run ``work`` with it on a warm driver's thread,
    disconnect (the browser itself stays up: its sandbox owns it) and return what ``work`` did.

    ``artifacts_dir`` is where the browser writes downloads for Playwright to read: a sandboxed
    browser may not see the driver's /tmp (its ``details["artifacts_dir"]`` says where)."""

    def job() -> T:
        browser = _connect(cdp_url, artifacts_dir)
        try:
            return work(browser)
        finally:
            browser.close()

    return _POOL.submit(job).result()
