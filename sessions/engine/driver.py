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
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar, cast

from playwright.sync_api import Browser, Playwright, sync_playwright
from playwright.sync_api import Error as PlaywrightError

from sessions.engine.frames import FramePump

T = TypeVar("T")

# More threads than a worker runs browsers at once; idle ones cost one idle driver each.
_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="playwright")
_local = threading.local()

# Connecting waits for the browser to describe its pages: ~15 s is generous on a host, but a
# microVM under software emulation is tens of times slower. Past two minutes it is not coming.
_CONNECT_MS = 15_000.0
_CONNECT_MAX_MS = 120_000.0


def connect_timeout_ms(time_scale: float) -> float:
    """How long to wait for a browser whose actions take ``time_scale`` times a host's."""
    return min(_CONNECT_MS * max(time_scale, 1.0), _CONNECT_MAX_MS)


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


def warm() -> None:
    """Start a driver now, in the background, so that the first run or continuation of a
    process that just started does not wait for Node.js (a failure to start shows on first use).
    Only in the process that runs the work: a driver does not survive a fork."""
    _POOL.submit(_driver)


# The frame pump of each connected browser that draws on request (see ``frames``).
_pumps: weakref.WeakKeyDictionary[Browser, FramePump] = weakref.WeakKeyDictionary()


def frames(browser: Browser) -> FramePump | None:
    """The pump drawing ``browser``'s pages, when it draws only on request; None when it draws
    on its own clock."""
    return _pumps.get(browser)


def _connect(cdp_url: str, artifacts_dir: str | None, timeout_ms: float) -> Browser:
    # The pump first: on a browser that draws on request, nothing that waits for a frame may
    # start before frames come.
    pump = FramePump.open(cdp_url, time_scale=timeout_ms / _CONNECT_MS)
    try:
        try:
            browser = _driver().chromium.connect_over_cdp(
                cdp_url, timeout=timeout_ms, artifacts_dir=artifacts_dir
            )
        except PlaywrightError as exc:
            # A driver that died since its last use says so on first contact; start another.
            if "closed" not in str(exc).lower() and "connection" not in str(exc).lower():
                raise
            browser = _driver(fresh=True).chromium.connect_over_cdp(
                cdp_url, timeout=timeout_ms, artifacts_dir=artifacts_dir
            )
    except BaseException:
        if pump is not None:
            pump.close()
        raise
    if pump is not None:
        _pumps[browser] = pump
    return browser


def _disconnect(browser: Browser) -> None:
    pump = _pumps.pop(browser, None)
    with contextlib.suppress(PlaywrightError):
        browser.close()
    if pump is not None:
        pump.close()


class Connection:
    """A browser connection opened now for work handed over later, on one warm driver's thread.

    A continuation opens it while it still checks the run in the database, so the reviewer does
    not wait for the two one after the other. Until ``run`` hands over the work nothing is done
    with the browser but connecting; ``close`` (or the end of a ``with`` block) without ``run``
    disconnects. The browser itself stays up: its sandbox owns it.
    """

    def __init__(
        self,
        cdp_url: str,
        *,
        artifacts_dir: str | None = None,
        timeout_ms: float = _CONNECT_MS,
    ) -> None:
        self._work: queue.SimpleQueue[Callable[[Browser], object] | None] = queue.SimpleQueue()
        self._handed = False
        self._done = _POOL.submit(self._hold, cdp_url, artifacts_dir, timeout_ms)

    def _hold(self, cdp_url: str, artifacts_dir: str | None, timeout_ms: float) -> object:
        browser = _connect(cdp_url, artifacts_dir, timeout_ms)
        try:
            work = self._work.get()
            return None if work is None else work(browser)
        finally:
            _disconnect(browser)

    def run(self, work: Callable[[Browser], T]) -> T:
        """Run ``work`` with the browser on the driver's thread and return what it did (or
        raise what connecting or ``work`` raised)."""
        if self._handed:
            raise RuntimeError("this browser connection was already used or closed")
        self._handed = True
        self._work.put(work)
        return cast(T, self._done.result())

    def close(self) -> None:
        if not self._handed:
            self._handed = True
            self._work.put(None)

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ConnectionLost(Exception):
    """A held connection closed (idle too long, or its browser went away); open another."""


class HeldConnection:
    """A browser connection kept open for several pieces of work, one at a time, on one warm
    driver's thread, until it is closed or idle for ``idle_seconds``.

    For a browser people work with piece by piece (a scratch session): a new connection per
    piece costs a connect, and Chromium restyles and lays out the whole page when Playwright
    sets up a new connection (100 ms on a 1,000-row table). The thread it holds is the pool's
    until then.
    """

    def __init__(
        self,
        cdp_url: str,
        *,
        artifacts_dir: str | None = None,
        timeout_ms: float = _CONNECT_MS,
        idle_seconds: float = 60.0,
    ) -> None:
        self._work: queue.SimpleQueue[tuple[Callable[[Browser], object], Future[object]] | None]
        self._work = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._done = _POOL.submit(self._hold, cdp_url, artifacts_dir, timeout_ms, idle_seconds)

    def _hold(
        self, cdp_url: str, artifacts_dir: str | None, timeout_ms: float, idle_seconds: float
    ) -> None:
        browser = _connect(cdp_url, artifacts_dir, timeout_ms)
        try:
            while True:
                try:
                    item = self._work.get(timeout=idle_seconds)
                except queue.Empty:
                    return
                if item is None:
                    return
                work, result = item
                try:
                    result.set_result(work(browser))
                except BaseException as exc:
                    result.set_exception(exc)
                if not browser.is_connected():
                    return
        finally:
            _disconnect(browser)
            # Work handed over while the thread was leaving is told so, not left waiting.
            while True:
                try:
                    left = self._work.get_nowait()
                except queue.Empty:
                    break
                if left is not None:
                    left[1].set_exception(ConnectionLost("the browser connection closed"))

    def run(self, work: Callable[[Browser], T]) -> T:
        """Run ``work`` with the browser on the connection's thread and return what it did.
        Raises ConnectionLost when the connection is gone (then open another), or what
        connecting or ``work`` raised."""
        with self._lock:
            if self._done.done():
                self._done.result()  # what connecting raised, if it failed
                raise ConnectionLost("the browser connection closed")
            result: Future[object] = Future()
            self._work.put((work, result))
        either: list[Future[Any]] = [result, self._done]
        wait(either, return_when=FIRST_COMPLETED)
        if not result.done():
            self._done.result()
            raise ConnectionLost("the browser connection closed")
        return cast(T, result.result())

    def close(self, *, wait: bool = False) -> None:
        """Disconnect once the work handed over is done; ``wait`` for the thread to be free."""
        self._work.put(None)
        if wait:
            with contextlib.suppress(Exception):
                self._done.result(timeout=10)

    @property
    def open(self) -> bool:
        return not self._done.done()


def with_browser(
    cdp_url: str,
    work: Callable[[Browser], T],
    *,
    artifacts_dir: str | None = None,
    timeout_ms: float = _CONNECT_MS,
) -> T:
    """Connect to the browser at ``cdp_url``, run ``work`` with it on a warm driver's thread,
    disconnect (the browser itself stays up: its sandbox owns it) and return what ``work`` did.

    ``artifacts_dir`` is where the browser writes downloads for Playwright to read: a sandboxed
    browser may not see the driver's /tmp (its ``details["artifacts_dir"]`` says where)."""
    with Connection(cdp_url, artifacts_dir=artifacts_dir, timeout_ms=timeout_ms) as connection:
        return connection.run(work)
