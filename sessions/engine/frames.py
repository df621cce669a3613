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

A browser that draws on its own clock refuses ``beginFrame``; ``FramePump.open`` then returns
None and pictures come from ``Page.captureScreenshot`` as before.

One frame at a time per browser, whatever the page: the headless shell refuses a second frame for
a page whose frame is pending ("Another frame is pending", harmless), but not one for another
page, and the GPU process dies of it ("Got overlapping IssueExternalBeginFrame"; after six such
deaths the whole browser exits). So a process has one pump per browser, shared by everything
that needs frames (the runner's connection, the live view's tap) and counted by its users, and
the pump holds its lock from a frame's request to Chromium's answer, even when whoever asked for
it stops waiting. Pumps of two processes on one browser are not serialised: a browser is held by
one worker process at a time.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from sessions.engine.chromium import browser_websocket_url

__all__ = ["FRAME_INTERVAL_MS", "FramePump", "FramesError", "frame_pending", "not_drawn_on_request"]

# Display pace: what a browser drawing on its own clock does, so pages behave as they would there.
FRAME_INTERVAL_MS = 1000 / 60
_PENDING = "Another frame is pending"
# How Chromium 156 refuses beginFrame where pages draw on their own clock: the desktop browser
# has no HeadlessExperimental domain; the headless shell needs --enable-begin-frame-control.
_FREE_RUNNING = ("wasn't found", "only supported if BeginFrameControl is enabled")
# How long a picture may wait for its frame: a frame during which the page opened a JavaScript
# dialog is answered only once the dialog is.
_PICTURE_SECONDS = 10.0

_loop: asyncio.AbstractEventLoop | None = None
_registry_lock = threading.Lock()
# The pump of each browser this process draws, by address. Opening one is serialised so that two
# threads opening at once share one (it takes a few round trips).
_pumps: dict[str, FramePump] = {}
_opening = threading.Lock()


def _shared_loop() -> asyncio.AbstractEventLoop:
    """One event loop thread for every pump of this process: a pump is a few sockets and a
    timer, not worth a thread each."""
    global _loop
    with _registry_lock:
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
    """Draws the frames of every page of one begin-frame-controlled browser while anyone in this
    process uses it.

    ``open`` hands out the process's pump for a browser (or None for a browser that draws on
    its own), ``close`` gives it back; the last ``close`` disconnects. Thread-safe: ``open``,
    ``picture`` and ``close`` may be called from any thread (the runner's is Playwright's,
    the tap's its event loop's, through ``asyncio.to_thread``); the pump's own work runs on the
    shared frame-pump loop.
    """

    def __init__(self, cdp_url: str, *, answer_seconds: float) -> None:
        self.cdp_url = cdp_url
        self.answer_seconds = answer_seconds
        self.loop = _shared_loop()
        self.drawing_on_request: bool | None = None
        self._users = 0
        self._decided: asyncio.Event | None = None
        self._http: aiohttp.ClientSession | None = None
        self._socket: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ids = 0
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._pages: dict[str, _Page] = {}
        self._attaching: dict[str, asyncio.Future[_Page | None]] = {}
        self._lock: asyncio.Lock | None = None
        # Tasks the pump starts and must keep until done (the loop holds weak references only).
        self._tasks: set[asyncio.Future[Any]] = set()
        self._closed = False

    # Lifetime ------------------------------------------------------------------------------

    @classmethod
    def open(cls, cdp_url: str, *, time_scale: float = 1.0) -> FramePump | None:
        """The pump drawing the pages of the browser at ``cdp_url`` for one more user, or None
        when that browser draws on its own clock. Raises FramesError when it does not answer."""
        address = cdp_url.rstrip("/")
        with _opening:
            with _registry_lock:
                pump = _pumps.get(address)
                if pump is not None and pump.alive:
                    pump._users += 1
                    return pump
            pump = cls(address, answer_seconds=min(10.0 * max(time_scale, 1.0), 120.0))
            future = asyncio.run_coroutine_threadsafe(pump._open(), pump.loop)
            try:
                controlled = future.result(pump.answer_seconds + 5)
            except concurrent.futures.TimeoutError:
                pump._shut()
                raise FramesError(f"the browser at {address} did not answer in time") from None
            except BaseException:
                pump._shut()
                raise
            if not controlled:
                pump._shut()
                return None
            with _registry_lock:
                pump._users = 1
                _pumps[address] = pump
            return pump

    @property
    def alive(self) -> bool:
        return not self._closed and self._socket is not None and not self._socket.closed

    def close(self) -> None:
        """Give the pump back; the last user's close stops drawing and disconnects (the pages
        keep the last frame they drew)."""
        with _registry_lock:
            self._users -= 1
            if self._users > 0:
                return
            if _pumps.get(self.cdp_url) is self:
                del _pumps[self.cdp_url]
        self._shut()

    def _shut(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(5)

    # Pictures ------------------------------------------------------------------------------

    def picture(self, target_id: str, *, quality: int) -> concurrent.futures.Future[bytes]:
        """A JPEG of the frame drawn for the page ``target_id`` as it is now, when it comes.

        A future, so that the caller's thread can go on serving events while it waits
        (Playwright's thread must, to hand a dialog opened during the frame to whoever answers
        it). It fails with FramesError after its deadline; its frame then keeps the pump's lock
        until Chromium answers it.
        """
        if self._closed:
            raise FramesError("the frame pump is closed")
        deadline = _PICTURE_SECONDS * max(1.0, self.answer_seconds / 10.0)
        return asyncio.run_coroutine_threadsafe(
            self._picture(target_id, quality, deadline), self.loop
        )

    def frames_drawn(self) -> int:
        """Frames asked for and drawn so far, over all pages (for tests and benchmarks)."""
        return sum(page.frames for page in list(self._pages.values()))

    # On the loop ---------------------------------------------------------------------------

    def _keep(self, task: asyncio.Future[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _open(self) -> bool:
        self._decided = asyncio.Event()
        self._lock = asyncio.Lock()
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
        if pages:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.answer_seconds / 5):
                    await self._decided.wait()
        # A browser that draws on its own refuses the first frame at once; one whose first frame
        # is still pending draws on request (the frame is held up by a dialog, say). With no
        # page to ask, the first page's first frame decides, and until then pictures fall back
        # to Page.captureScreenshot.
        return self.drawing_on_request is not False

    async def _close(self) -> None:
        for page in list(self._pages.values()):
            if page.task is not None:
                page.task.cancel()
        if self._reader is not None:
            self._reader.cancel()
        # Closing the socket makes Chromium drop a frame still pending: no frame outlives it.
        if self._socket is not None:
            await self._socket.close()
        if self._http is not None:
            await self._http.close()
        self._pages.clear()

    async def _attach(self, target_id: str) -> _Page | None:
        page = self._pages.get(target_id)
        if page is not None:
            return page
        attaching = self._attaching.get(target_id)
        if attaching is None:
            attaching = self._attaching[target_id] = asyncio.ensure_future(
                self._attach_now(target_id)
            )
            self._keep(attaching)
            attaching.add_done_callback(lambda _: self._attaching.pop(target_id, None))
        return await asyncio.shield(attaching)

    async def _attach_now(self, target_id: str) -> _Page | None:
        try:
            attached = await self._call(
                "Target.attachToTarget", {"targetId": target_id, "flatten": True}
            )
        except FramesError:
            return None  # closed meanwhile
        page = self._pages[target_id] = _Page(target_id, attached["sessionId"])
        page.task = asyncio.create_task(self._pump(page))
        return page

    def _forget(self, page: _Page) -> None:
        if self._pages.get(page.target_id) is page:
            del self._pages[page.target_id]

    async def _pump(self, page: _Page) -> None:
        interval = FRAME_INTERVAL_MS / 1000
        due = time.monotonic()
        while not self._closed:
            answer = await self._frame(page, {"interval": FRAME_INTERVAL_MS})
            if answer is None:
                self._forget(page)
                return  # the connection is gone
            if "error" in answer:
                message = str(answer["error"].get("message", ""))
                if not_drawn_on_request(message):
                    self.drawing_on_request = False
                    if self._decided is not None:
                        self._decided.set()
                    self._forget(page)
                    return
                if not frame_pending(message):
                    self._forget(page)
                    return  # the page is gone
            else:
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
        """One beginFrame for ``page`` under the pump's lock: its answer with "result" or
        "error", or None when the connection closed. The lock is held until Chromium answers
        even if the caller stops waiting (a cancelled picture, a page task cancelled): a frame
        requested for another page meanwhile would crash the GPU process."""
        assert self._lock is not None
        lock = self._lock

        async def locked() -> dict[str, Any] | None:
            async with lock:
                try:
                    return await self._send("HeadlessExperimental.beginFrame", params, page.session)
                except FramesError:
                    return None

        frame = asyncio.ensure_future(locked())
        self._keep(frame)
        return await asyncio.shield(frame)

    async def _picture(self, target_id: str, quality: int, deadline: float) -> bytes:
        try:
            async with asyncio.timeout(deadline):
                return await self._picture_now(target_id, quality)
        except TimeoutError:
            raise FramesError(
                "the page drew no frame in time (a dialog opened while it was drawn?)"
            ) from None

    async def _picture_now(self, target_id: str, quality: int) -> bytes:
        page = await self._attach(target_id)
        if page is None:
            raise FramesError(f"the browser has no page {target_id}")
        params = {
            "interval": FRAME_INTERVAL_MS,
            "screenshot": {"format": "jpeg", "quality": quality},
        }
        while True:
            answer = await self._frame(page, params)
            if answer is None:
                raise FramesError("the browser closed the connection")
            if "error" in answer:
                message = str(answer["error"].get("message", ""))
                if frame_pending(message):
                    # Another client's frame for this page: ours is the next.
                    await asyncio.sleep(0.002)
                    continue
                if not_drawn_on_request(message):
                    self.drawing_on_request = False
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
            try:
                await self._socket.send_str(json.dumps(message))
            except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
                raise FramesError(f"the connection to the browser failed: {exc}") from None
            # No time limit here: a frame during which the page opened a dialog is answered
            # once the dialog is; the pictures' deadline is their own.
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
                        self._keep(asyncio.ensure_future(self._attach(str(info["targetId"]))))
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
            # The connection is gone: the next user opens another pump (``alive``).
            for waiting in self._waiting.values():
                if not waiting.done():
                    waiting.set_exception(FramesError("the browser closed the connection"))
