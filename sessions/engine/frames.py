"""Frames drawn on request: the pump that keeps a begin-frame-controlled browser's pages drawing,
and a step's picture taken as the frame drawn for that step (no Django imports).

A headless shell started with ``chromium.BEGIN_FRAME_ARGS`` draws a page only when a client sends
``HeadlessExperimental.beginFrame`` for it. Whatever waits on a frame would wait for ever
without one: Playwright's actionability checks (an element is "stable" after two animation
frames with the same box), ``requestAnimationFrame``, CSS animations, the live view's screencast,
``Page.captureScreenshot``. So while a client works with the browser, a ``FramePump`` on a CDP
connection of its own asks every page for a frame at display pace, and the step's picture is a
frame like any other, asked for with a screenshot: the page's state when the step's evidence is
taken, in one round trip, without the forced redraw and read-back of ``Page.captureScreenshot``.

A browser that draws on its own clock refuses ``beginFrame``; ``FramePump.start`` then returns
None and pictures come from ``Page.captureScreenshot`` as before.

One frame at a time per browser, whatever the page: the headless shell refuses a second frame for
a page whose frame is pending ("Another frame is pending", harmless), but not one for another
page, and the GPU process dies of it ("Got overlapping IssueExternalBeginFrame"; after six such
deaths the whole browser exits). So the pumps of one process share one lock per browser, and a
live view's tap in the same process draws nothing while a pump does (``drawing``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from sessions.engine.chromium import browser_websocket_url

__all__ = [
    "FRAME_INTERVAL_MS",
    "FramePump",
    "FramesError",
    "drawing",
    "frame_pending",
    "not_drawn_on_request",
]

# Display pace: what a browser drawing on its own clock does, so pages behave as they would there.
FRAME_INTERVAL_MS = 1000 / 60
_PENDING = "Another frame is pending"
# How long a picture may wait for its page: a page behind a JavaScript dialog draws nothing
# until the dialog is answered.
_PICTURE_SECONDS = 10.0

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()
# Pumps open in this process, by browser address: their frames are serialised by one lock per
# browser (used on the shared loop only), and a tap asks ``drawing`` before drawing itself.
_open_pumps: dict[str, int] = {}
_browser_locks: dict[str, asyncio.Lock] = {}


def drawing(cdp_url: str) -> bool:
    """Whether a pump of this process draws the browser at ``cdp_url`` now."""
    with _loop_lock:
        return _open_pumps.get(cdp_url.rstrip("/"), 0) > 0


def _shared_loop() -> asyncio.AbstractEventLoop:
    """One event loop thread for every pump of this process: a pump is a few sockets and a
    timer, not worth a thread each."""
    global _loop
    with _loop_lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="frame-pump", daemon=True).start()
            _loop = loop
        return _loop


class FramesError(Exception):
    """A frame could not be had: the browser closed, or the page did not draw in time."""


def frame_pending(message: str) -> bool:
    """Whether a refused ``beginFrame`` was refused only because another client's frame for the
    same page is being drawn."""
    return _PENDING in message


# How Chromium 156 refuses beginFrame where pages draw on their own clock: the desktop browser
# has no HeadlessExperimental domain; the headless shell needs --enable-begin-frame-control.
_FREE_RUNNING = ("wasn't found", "only supported if BeginFrameControl is enabled")


def not_drawn_on_request(message: str) -> bool:
    """Whether a refused ``beginFrame`` says this browser draws on its own clock."""
    return any(words in message for words in _FREE_RUNNING)


@dataclass
class _Page:
    target_id: str
    session: str
    task: asyncio.Task[None] | None = None
    frames: int = 0


class FramePump:
    """Draws the frames of every page of one begin-frame-controlled browser while it is open.

    ``start`` returns None for a browser that draws on its own. Thread-safe: ``picture`` and
    ``close`` may be called from any thread (the runner's is Playwright's); the pump's own
    work runs on the shared frame-pump loop.
    """

    def __init__(self, cdp_url: str, *, answer_seconds: float) -> None:
        self.cdp_url = cdp_url.rstrip("/")
        self.answer_seconds = answer_seconds
        self.loop = _shared_loop()
        self.drawing_on_request: bool | None = None
        self._decided: asyncio.Event | None = None
        self._http: aiohttp.ClientSession | None = None
        self._socket: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ids = 0
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._pages: dict[str, _Page] = {}
        self._attaching: set[str] = set()
        self._lock: asyncio.Lock | None = None
        self._counted = False
        # Tasks started from the reader, kept until done (the loop holds only weak references).
        self._tasks: set[asyncio.Task[_Page | None]] = set()
        self._closed = False

    # Lifetime ------------------------------------------------------------------------------

    @classmethod
    def start(cls, cdp_url: str, *, time_scale: float = 1.0) -> FramePump | None:
        """A pump drawing the pages of the browser at ``cdp_url``, or None when that browser
        draws on its own clock. Raises FramesError when the browser does not answer."""
        pump = cls(cdp_url, answer_seconds=min(10.0 * max(time_scale, 1.0), 120.0))
        future = asyncio.run_coroutine_threadsafe(pump._open(), pump.loop)
        try:
            controlled = future.result(pump.answer_seconds + 5)
        except BaseException:
            pump.close()
            raise
        if not controlled:
            pump.close()
            return None
        with _loop_lock:
            _open_pumps[pump.cdp_url] = _open_pumps.get(pump.cdp_url, 0) + 1
            pump._counted = True
        return pump

    def close(self) -> None:
        """Stop drawing and disconnect; the pages keep the last frame they drew."""
        if self._closed:
            return
        self._closed = True
        with _loop_lock:
            if self._counted:
                _open_pumps[self.cdp_url] -= 1
                if not _open_pumps[self.cdp_url]:
                    del _open_pumps[self.cdp_url]
                    _browser_locks.pop(self.cdp_url, None)
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(5)

    def __enter__(self) -> FramePump:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Pictures ------------------------------------------------------------------------------

    def picture(self, target_id: str, *, quality: int) -> bytes:
        """A JPEG of the frame drawn for the page ``target_id`` as it is now."""
        if self._closed:
            raise FramesError("the frame pump is closed")
        future = asyncio.run_coroutine_threadsafe(self._picture(target_id, quality), self.loop)
        try:
            return future.result(_PICTURE_SECONDS * max(1.0, self.answer_seconds / 10.0) + 1)
        except TimeoutError:
            future.cancel()
            raise FramesError("the page drew no frame in time (is a dialog open?)") from None

    def frames_drawn(self) -> int:
        """Frames asked for and drawn so far, over all pages (for tests and benchmarks)."""
        return sum(page.frames for page in list(self._pages.values()))

    # On the loop ---------------------------------------------------------------------------

    async def _open(self) -> bool:
        self._decided = asyncio.Event()
        with _loop_lock:
            self._lock = _browser_locks.setdefault(self.cdp_url, asyncio.Lock())
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.answer_seconds + 5)
        )
        try:
            async with self._http.get(f"{self.cdp_url}/json/version") as answer:
                version = await answer.json(content_type=None)
            url = browser_websocket_url(self.cdp_url, str(version["webSocketDebuggerUrl"]))
            self._socket = await self._http.ws_connect(url, max_msg_size=0, autoping=True)
        except (aiohttp.ClientError, KeyError, ValueError, TimeoutError) as exc:
            raise FramesError(f"the browser did not answer at {self.cdp_url}: {exc}") from None
        self._reader = asyncio.create_task(self._read())
        await self._call("Target.setDiscoverTargets", {"discover": True})
        targets = (await self._call("Target.getTargets"))["targetInfos"]
        pages = [t["targetId"] for t in targets if t.get("type") == "page"]
        for target_id in pages:
            await self._attach(target_id)
        if not pages:
            # Nothing to ask yet: a browser whose first page is still coming. Taken as drawing
            # on request when it is the headless shell, which is the only one that can.
            self.drawing_on_request = str(version.get("Browser", "")).startswith("HeadlessChrome")
            self._decided.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._decided.wait(), self.answer_seconds / 5)
        # A browser that draws on its own refuses the first frame at once; one whose frame is
        # not answered yet is one that draws on request, behind a dialog for instance.
        return self.drawing_on_request is not False

    async def _close(self) -> None:
        for page in list(self._pages.values()):
            if page.task is not None:
                page.task.cancel()
        if self._reader is not None:
            self._reader.cancel()
        if self._socket is not None:
            await self._socket.close()
        if self._http is not None:
            await self._http.close()
        self._pages.clear()

    async def _attach(self, target_id: str) -> _Page | None:
        page = self._pages.get(target_id)
        if page is not None or target_id in self._attaching:
            return page
        self._attaching.add(target_id)
        try:
            attached = await self._call(
                "Target.attachToTarget", {"targetId": target_id, "flatten": True}
            )
        except FramesError:
            return None  # closed meanwhile
        finally:
            self._attaching.discard(target_id)
        page = self._pages[target_id] = _Page(target_id, attached["sessionId"])
        page.task = asyncio.create_task(self._pump(page))
        return page

    async def _pump(self, page: _Page) -> None:
        interval = FRAME_INTERVAL_MS / 1000
        due = time.monotonic()
        while not self._closed:
            assert self._lock is not None
            async with self._lock:
                answer = await self._frame(page, {"interval": FRAME_INTERVAL_MS})
            if answer is not None and "error" in answer:
                message = str(answer["error"].get("message", ""))
                if not_drawn_on_request(message) and page.frames == 0:
                    self.drawing_on_request = False
                    if self._decided is not None:
                        self._decided.set()
                    return
                if not frame_pending(message):
                    return  # the page is gone
            elif answer is not None:
                page.frames += 1
                if self.drawing_on_request is None:
                    self.drawing_on_request = True
                    if self._decided is not None:
                        self._decided.set()
            due += interval
            now = time.monotonic()
            if due < now:
                due = now  # behind (a busy page, a dialog): no burst to catch up
            await asyncio.sleep(due - now)

    async def _frame(self, page: _Page, params: dict[str, Any]) -> dict[str, Any] | None:
        """One beginFrame for ``page``: its answer with "result" or "error", or None when the
        connection closed."""
        try:
            return await self._send("HeadlessExperimental.beginFrame", params, page.session)
        except FramesError:
            return None

    async def _picture(self, target_id: str, quality: int) -> bytes:
        page = self._pages.get(target_id) or await self._attach(target_id)
        if page is None:
            raise FramesError(f"the browser has no page {target_id}")
        params = {
            "interval": FRAME_INTERVAL_MS,
            "screenshot": {"format": "jpeg", "quality": quality},
        }
        while True:
            assert self._lock is not None
            async with self._lock:
                answer = await self._frame(page, params)
            if answer is None:
                raise FramesError("the browser closed the connection")
            if "error" in answer:
                message = str(answer["error"].get("message", ""))
                if frame_pending(message):
                    # Another client's frame for this page: ours is the next.
                    await asyncio.sleep(0.002)
                    continue
                raise FramesError(f"beginFrame: {message}")
            data = answer.get("result", {}).get("screenshotData")
            if data:
                page.frames += 1
                return base64.b64decode(data)
            # A frame that drew nothing new can come without a picture: ask again, the screenshot
            # request itself makes the next one draw.
            await asyncio.sleep(0)

    # CDP -----------------------------------------------------------------------------------

    async def _call(
        self, method: str, params: dict[str, Any] | None = None, session: str = ""
    ) -> dict[str, Any]:
        answer = await self._send(method, params, session)
        if "error" in answer:
            raise FramesError(f"{method}: {answer['error'].get('message', answer['error'])}")
        return dict(answer.get("result") or {})

    async def _send(
        self, method: str, params: dict[str, Any] | None, session: str
    ) -> dict[str, Any]:
        if self._socket is None or self._socket.closed:
            raise FramesError("the connection to the browser is closed")
        self._ids += 1
        message: dict[str, Any] = {"id": self._ids, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[self._ids] = answer
        try:
            await self._socket.send_str(json.dumps(message))
            # No time limit: a page behind a dialog answers its frame once the dialog is gone,
            # and the pictures' own deadline is the caller's.
            return await answer
        finally:
            self._waiting.pop(message["id"], None)

    async def _read(self) -> None:
        assert self._socket is not None
        try:
            async for message in self._socket:
                if message.type != aiohttp.WSMsgType.TEXT:
                    break
                data = json.loads(message.data)
                if "id" in data:
                    waiting = self._waiting.get(data["id"])
                    if waiting is not None and not waiting.done():
                        waiting.set_result(data)
                    continue
                method = data.get("method")
                params = data.get("params") or {}
                if method == "Target.targetCreated":
                    info = params.get("targetInfo") or {}
                    if info.get("type") == "page" and not self._closed:
                        attaching = asyncio.create_task(self._attach(str(info["targetId"])))
                        self._tasks.add(attaching)
                        attaching.add_done_callback(self._tasks.discard)
                elif method in ("Target.targetDestroyed", "Target.detachedFromTarget"):
                    gone = params.get("targetId") or next(
                        (
                            p.target_id
                            for p in self._pages.values()
                            if p.session == params.get("sessionId")
                        ),
                        None,
                    )
                    page = self._pages.pop(str(gone), None) if gone else None
                    if page is not None and page.task is not None:
                        page.task.cancel()
        finally:
            for waiting in self._waiting.values():
                if not waiting.done():
                    waiting.set_exception(FramesError("the browser closed the connection"))
