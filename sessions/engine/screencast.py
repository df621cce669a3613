"""A CDP connection of its own to a run's browser: screencast frames and a person's input
(no Django imports).

The runner's Playwright connection is busy with steps (and sync Playwright only reads events
while it is inside a call), so the live view opens a second CDP client on the same browser: it
works on every backend, since each gives the runner a CDP address, and a person's clicks and
keys reach the same browser behind the same egress proxy and allowlist.

Frames are masked the way step screenshots are: password inputs, fields holding one of the
run's secret values, and the fields the workflow types secrets into are painted over in the
same colour, in each frame before it leaves this module. The boxes are read in an isolated
world just after the frame arrives, in document coordinates, and placed with the frame's own
scroll offset, so a scroll between the two does not move a mask off its field.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import io
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from PIL import Image, ImageDraw

from sessions.engine.chromium import browser_websocket_url
from sessions.engine.frames import FramePump, FramesError

# Playwright paints masked elements in this colour; live frames look the same.
MASK_COLOUR = (255, 0, 255)
# A mask a little wider than its field: anti-aliased edges and the caret stay covered.
MASK_MARGIN = 2
# Chromium sends a screencast frame while fewer than three are unacknowledged (Chromium 156):
# holding the last two shown leaves room for exactly the next one. With a browser that allows
# fewer, frames stop, and the restart after a pause brings the next (slower, still current).
HELD_FRAMES = 2
# JPEG quality of live frames (the browser's and a masked frame's): a picture to watch and
# click on, lower than the evidence screenshots'.
FRAME_QUALITY = 50
# Keys that do something without producing text (CDP wants their Windows key codes).
_SPECIAL_KEYS: dict[str, int] = {
    "Backspace": 8, "Tab": 9, "Enter": 13, "Escape": 27, "PageUp": 33, "PageDown": 34,
    "End": 35, "Home": 36, "ArrowLeft": 37, "ArrowUp": 38, "ArrowRight": 39, "ArrowDown": 40,
    "Delete": 46,
}  # fmt: skip
_KEY_TEXT = {"Enter": "\r"}

# Runs in an isolated world: the page's own scripts can neither see the secrets passed in nor
# change what this code reads. Returns the secret fields' boxes (document coordinates) and
# whether the focused element is one of them.
_FIELD_SCAN = r"""(function (secrets, fields) {
  const words = t => (t || '').replace(/\s+/g, ' ').trim().toLowerCase();
  const nameOf = e => {
    const parts = [e.getAttribute('aria-label'), e.getAttribute('placeholder'),
                   e.getAttribute('title')];
    if (e.labels) for (const l of e.labels) parts.push(l.textContent);
    const by = e.getAttribute('aria-labelledby');
    if (by) for (const id of by.split(/\s+/)) {
      const n = document.getElementById(id); if (n) parts.push(n.textContent);
    }
    return parts.map(words).filter(Boolean);
  };
  const same = (have, want, exact) => exact ? have === want : have.includes(want);
  const marked = e => fields.some(f => {
    try {
      if (f.css) return e.matches(f.css);
      if (f.test_id) return e.getAttribute('data-testid') === f.test_id;
      const want = words(f.label || f.placeholder || f.name);
      if (!want) return false;
      if (f.placeholder) return same(words(e.getAttribute('placeholder')), want, f.exact);
      return nameOf(e).some(n => same(n, want, f.exact));
    } catch (err) { return true; }  // a target this code cannot read is treated as secret
  });
  const holds = e => {
    const v = ('value' in e ? e.value : e.textContent) || '';
    return v && secrets.some(s => v.includes(s));
  };
  const secret = e => e.type === 'password' || marked(e) || holds(e);
  const boxes = [];
  for (const e of document.querySelectorAll(
      'input, textarea, [contenteditable=""], [contenteditable="true"]')) {
    if (!secret(e)) continue;
    const r = e.getBoundingClientRect();
    if (r.width && r.height) boxes.push([r.left + scrollX, r.top + scrollY, r.width, r.height]);
  }
  let focused = document.activeElement, where = 'page';
  while (focused && focused.tagName === 'IFRAME') {
    let inner = null;
    try { inner = focused.contentDocument && focused.contentDocument.activeElement; }
    catch (err) { inner = null; }
    if (!inner) { where = 'frame'; break; }
    focused = inner;
  }
  return {boxes, focus: where === 'frame' ? 'frame' : (focused && secret(focused) ? 'secret' : '')};
})"""


class CdpError(Exception):
    """The browser could not be reached or refused a command; the message is for people."""


@dataclass(frozen=True)
class Frame:
    """One screencast frame, masked: JPEG bytes and where it came from."""

    jpeg: bytes
    width: int
    height: int
    # What one CSS pixel of the page is in this frame (frames may be scaled down).
    device_width: float
    device_height: float
    captured_at: float  # seconds since the epoch, the browser's clock
    masks: int


def mask_frame(
    jpeg: bytes,
    boxes: Sequence[Sequence[float]],
    metadata: dict[str, Any],
    *,
    quality: int = FRAME_QUALITY,
) -> Frame:
    """Paint ``boxes`` (document CSS pixels) over a screencast frame taken with ``metadata``
    (or a screenshot: ``deviceWidth`` its width in CSS pixels, no scroll). The frame is decoded
    and encoded again, at ``quality``, only when a box lies on it; an empty box (a field not
    shown) is not painted."""
    image: Image.Image = Image.open(io.BytesIO(jpeg))
    device_width = float(metadata.get("deviceWidth") or image.width)
    device_height = float(metadata.get("deviceHeight") or image.height)
    scale = image.width / device_width if device_width else 1.0
    scroll_x = float(metadata.get("scrollOffsetX") or 0.0)
    scroll_y = float(metadata.get("scrollOffsetY") or 0.0)
    offset_top = float(metadata.get("offsetTop") or 0.0)
    rectangles = []
    for left, top, width, height in boxes:
        if width <= 0 or height <= 0:
            continue
        x0 = (left - scroll_x) * scale - MASK_MARGIN
        y0 = (top - scroll_y + offset_top) * scale - MASK_MARGIN
        x1 = x0 + width * scale + 2 * MASK_MARGIN
        y1 = y0 + height * scale + 2 * MASK_MARGIN
        if x1 < 0 or y1 < 0 or x0 > image.width or y0 > image.height:
            continue
        rectangles.append((x0, y0, x1, y1))
    if rectangles:
        image = image.convert("RGB")
        draw = ImageDraw.Draw(image)
        for rectangle in rectangles:
            draw.rectangle(rectangle, fill=MASK_COLOUR)
        out = io.BytesIO()
        image.save(out, format="JPEG", quality=quality)
        jpeg = out.getvalue()
    return Frame(
        jpeg=jpeg,
        width=image.width,
        height=image.height,
        device_width=device_width,
        device_height=device_height,
        captured_at=float(metadata.get("timestamp") or time.time()),
        masks=len(rectangles),
    )


@dataclass(frozen=True)
class Dialog:
    """A JavaScript dialog the page opened: alert, confirm, prompt or beforeunload; or
    ``unknown``, one already open when the tap attached, whose text Chromium does not give."""

    kind: str
    message: str
    default_prompt: str = ""


UNREADABLE_DIALOG = Dialog(
    kind="unknown",
    message=(
        "(it opened before the live view connected: its text cannot be read, and answering it "
        "reloads the page)"
    ),
)


def _timed_mask(
    jpeg: bytes, boxes: Sequence[Sequence[float]], metadata: dict[str, Any]
) -> tuple[Frame, float]:
    started = time.thread_time()
    frame = mask_frame(jpeg, boxes, metadata)
    return frame, time.thread_time() - started


class BrowserTap:
    """A CDP client of the run's browser, attached to the page the runner works on.

    Not thread-safe: use it from one asyncio loop. ``on_frame`` receives each masked frame, at
    most ``fps`` a second: a frame that comes sooner is held back unacknowledged (the browser
    makes no new one meanwhile, beyond the one it may have in flight), and the newest is masked
    and shown when it is due.
    """

    def __init__(
        self,
        cdp_url: str,
        *,
        secret_values: Sequence[str],
        secret_fields: Sequence[dict[str, Any]],
        on_frame: Callable[[Frame], Awaitable[None]],
        on_navigated: Callable[[str], None] | None = None,
        on_dialog: Callable[[Dialog | None], None] | None = None,
        time_scale: float = 1.0,
    ) -> None:
        self.cdp_url = cdp_url.rstrip("/")
        # A browser whose actions take ``time_scale`` times a host's (a microVM under software
        # emulation) answers as much later; past two minutes it is not answering.
        self._answer_seconds = min(10.0 * max(time_scale, 1.0), 120.0)
        # Chromium answers Page.enable on a page that shows a JavaScript dialog only once the
        # dialog is closed, and says nothing of the dialog (puppeteer#9729): a page that has not
        # answered by then is taken to show one.
        self._dialog_probe_seconds = min(2.0 * max(time_scale, 1.0), self._answer_seconds)
        self._blocked: asyncio.Future[None] | None = None
        self.secret_values = [value for value in secret_values if value]
        self.secret_fields = list(secret_fields)
        self.on_frame = on_frame
        self.on_navigated = on_navigated
        self.on_dialog = on_dialog
        # The dialog open on the page, if any: the page's scripts are stopped until it is
        # answered, so nothing can be read from the page meanwhile.
        self.dialog: Dialog | None = None
        self.fps = 5.0
        self.casting = False
        self.last_frame: Frame | None = None
        # What the screencast cost, for the benchmark: frames the browser made, frames shown,
        # and this side's CPU seconds masking them.
        self.frames_made = 0
        self.frames_shown = 0
        self.mask_seconds = 0.0
        self._http: aiohttp.ClientSession | None = None
        self._socket: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ids = 0
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._methods: dict[int, str] = {}
        self._session = ""
        self._target = ""
        self._world: int | None = None
        self._main_frame = ""
        self._last_sent = 0.0
        self._frames: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=2)
        self._cast: dict[str, Any] = {}
        self._framer: asyncio.Task[None] | None = None
        # Where the browser draws only on request (``sessions.engine.frames``): the process's
        # pump for it, shared with the runner's connection, drawing while the tap is open so that
        # the cast shows the page and a person's clicks reach a drawn page.
        self._pump: FramePump | None = None

    # Connection ----------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._socket is not None and not self._socket.closed

    async def open(self) -> None:
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self._answer_seconds + 5)
        )
        try:
            async with self._http.get(f"{self.cdp_url}/json/version") as answer:
                version = await answer.json(content_type=None)
            url = browser_websocket_url(self.cdp_url, str(version["webSocketDebuggerUrl"]))
            self._socket = await self._http.ws_connect(url, max_msg_size=0, autoping=True)
        except (aiohttp.ClientError, KeyError, ValueError, TimeoutError) as exc:
            await self.close()
            raise CdpError(f"the run's browser did not answer at {self.cdp_url}: {exc}") from None
        self._reader = asyncio.create_task(self._read())
        self._framer = asyncio.create_task(self._frame_loop())
        try:
            self._pump = await asyncio.to_thread(
                FramePump.open, self.cdp_url, time_scale=self._answer_seconds / 10.0
            )
        except FramesError as exc:
            await self.close()
            raise CdpError(str(exc)) from None
        try:
            await self.attach()
        except CdpError:
            await self.close()
            raise

    async def close(self) -> None:
        if self._blocked is not None:
            self._blocked.cancel()
            self._blocked = None
        for task in (self._reader, self._framer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._socket is not None:
            await self._socket.close()
        if self._http is not None:
            await self._http.close()
        self._socket = self._http = None
        pump, self._pump = self._pump, None
        if pump is not None:
            await asyncio.to_thread(pump.close)
        self.casting = False

    async def attach(self) -> None:
        """Attach to the newest page, where the runner works (it follows new tabs too)."""
        targets = (await self.call("Target.getTargets"))["targetInfos"]
        pages = [t for t in targets if t.get("type") == "page"]
        if not pages:
            raise CdpError("the run's browser has no open page")
        target = pages[-1]["targetId"]
        if target == self._target and self._session:
            return
        attached = await self.call("Target.attachToTarget", {"targetId": target, "flatten": True})
        self._session, self._target, self._world = attached["sessionId"], target, None
        self.dialog = None
        if self._blocked is not None:  # the page it waited on is no longer the one watched
            self._blocked.cancel()
            self._blocked = None
        enabling = asyncio.ensure_future(self._enable_page())
        await asyncio.wait({enabling}, timeout=self._dialog_probe_seconds)
        if not enabling.done():
            # Behind a dialog: the tap finishes attaching, and casting starts, once the page
            # answers, after a person has answered the dialog (see answer_dialog).
            self._blocked = enabling
            session = self._session
            enabling.add_done_callback(
                lambda done: asyncio.ensure_future(self._unblocked(done, session))
            )
            if self.dialog is None:  # opened before anyone listened: no event named it
                self._dialog_opened(UNREADABLE_DIALOG)
            return
        enabling.result()

    async def _enable_page(self) -> None:
        # Patient: behind a dialog these are answered only once it is.
        await self.call("Page.enable", session=self._session, patient=True)
        tree = await self.call("Page.getFrameTree", session=self._session, patient=True)
        self._main_frame = tree["frameTree"]["frame"]["id"]

    async def _unblocked(self, enabling: asyncio.Future[None], session: str) -> None:
        """The page answered: its dialog is closed (or there never was one and the page was
        only slow), so a cast asked for meanwhile starts."""
        if self._blocked is enabling:
            self._blocked = None
        if session != self._session:
            return
        if self.dialog is UNREADABLE_DIALOG:
            # Answered, gone, or the connection failed: either way not a dialog to show.
            self.dialog = None
            if self.on_dialog is not None:
                self.on_dialog(None)
        if enabling.cancelled() or enabling.exception() is not None:
            return
        if self.casting:
            with contextlib.suppress(CdpError):
                await self.call("Page.startScreencast", self._cast, session=self._session)

    async def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session: str = "",
        patient: bool = False,
    ) -> dict[str, Any]:
        """One CDP call and its answer. ``patient``: wait as long as the connection lasts (a
        page behind a dialog answers once a person has answered the dialog)."""
        if self._socket is None:
            raise CdpError("the connection to the run's browser is closed")
        self._ids += 1
        message: dict[str, Any] = {"id": self._ids, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[self._ids] = answer
        self._methods[self._ids] = method
        try:
            # The send is bounded too: a browser that stops reading would hold it forever.
            async with asyncio.timeout(None if patient else self._answer_seconds):
                await self._socket.send_str(json.dumps(message))
                reply = await answer
        except TimeoutError:
            raise CdpError(f"the run's browser did not answer {method}") from None
        finally:
            self._waiting.pop(message["id"], None)
            self._methods.pop(message["id"], None)
        if "error" in reply:
            raise CdpError(f"{method}: {reply['error'].get('message', reply['error'])}")
        return dict(reply.get("result") or {})

    async def _read(self) -> None:
        assert self._socket is not None
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
            mine = data.get("sessionId") == self._session
            if method == "Page.screencastFrame" and mine:
                self.frames_made += 1
                if self._frames.full():
                    # The older frame is stale: only the newest is worth masking.
                    with contextlib.suppress(asyncio.QueueEmpty):
                        # Acknowledged from a task: this reader is what delivers the answer.
                        stale = self._frames.get_nowait()
                        asyncio.get_running_loop().create_task(self._ack(stale))
                self._frames.put_nowait(params)
            elif method == "Page.frameNavigated" and mine:
                frame = params.get("frame") or {}
                if not frame.get("parentId"):
                    self._world = None
                    if self.on_navigated is not None:
                        self.on_navigated(str(frame.get("url", "")))
            elif method == "Page.javascriptDialogOpening" and mine:
                self._dialog_opened(
                    Dialog(
                        kind=str(params.get("type", "alert")),
                        message=str(params.get("message", "")),
                        default_prompt=str(params.get("defaultPrompt", "")),
                    )
                )
            elif method == "Page.javascriptDialogClosed" and mine:
                if self.dialog is not None:
                    self.dialog = None
                    if self.on_dialog is not None:
                        self.on_dialog(None)
            elif method == "Target.detachedFromTarget" and params.get("sessionId") == self._session:
                self._session = self._target = ""
                self.dialog = None
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_exception(CdpError("the run's browser closed the connection"))

    def _dialog_opened(self, dialog: Dialog) -> None:
        self.dialog = dialog
        # The page's scripts stop until the dialog is answered: an evaluation waiting on them
        # cannot finish, and an input that opened the dialog has reached the page.
        for number, method in list(self._methods.items()):
            waiting = self._waiting.get(number)
            if waiting is None or waiting.done():
                continue
            if method == "Runtime.evaluate":
                waiting.set_result({"error": {"message": "a dialog is open on the page"}})
            elif method.startswith("Input."):
                waiting.set_result({"result": {}})
        if self.on_dialog is not None:
            self.on_dialog(dialog)

    async def answer_dialog(self, *, accept: bool, text: str | None = None) -> Dialog:
        """Accept or dismiss the open dialog (a prompt accepted with ``text``); returns it.
        One open before the tap attached is dismissed by reloading the page: Chromium answers
        only dialogs it opened while someone listened (the page may then ask again, readably)."""
        dialog = self.dialog
        if dialog is None:
            raise CdpError("no dialog is open on the page")
        # Before the answer: the page may open its next dialog as soon as this one closes.
        self.dialog = None
        try:
            if dialog is UNREADABLE_DIALOG:
                await self.call("Page.reload", session=self._session)
            else:
                params: dict[str, Any] = {"accept": accept}
                if accept and text is not None and dialog.kind == "prompt":
                    params["promptText"] = text
                await self.call("Page.handleJavaScriptDialog", params, session=self._session)
        except CdpError:
            if self.dialog is None:
                self.dialog = dialog
            raise
        return dialog

    # Screencast ----------------------------------------------------------------------------

    async def start(self, *, fps: float, max_width: int = 720, max_height: int = 504) -> None:
        """Start casting. The run page shows the picture about 800 pixels wide at most; 720
        keeps one viewer at 5 fps within a tenth of a core (bench/live_view.py: 8.4%, against
        11.6% at 960), the browser's readback and encoding being most of it."""
        self.fps = fps
        if self.casting:
            return
        await self.attach()
        self._cast = {
            "format": "jpeg",
            "quality": FRAME_QUALITY,
            "maxWidth": max_width,
            "maxHeight": max_height,
        }
        if self._blocked is None:
            await self.call("Page.startScreencast", self._cast, session=self._session)
        # Behind a dialog already open, the cast starts once it is answered (see _unblocked).
        self.casting = True

    async def _refresh(self) -> None:
        if not self.casting or self._blocked is not None:
            return
        with contextlib.suppress(CdpError):
            await self.call("Page.stopScreencast", session=self._session)
            await self.call("Page.startScreencast", self._cast, session=self._session)

    async def stop(self) -> None:
        if not self.casting:
            return
        self.casting = False
        with contextlib.suppress(CdpError):
            await self.call("Page.stopScreencast", session=self._session)

    async def _ack(self, params: dict[str, Any]) -> None:
        with contextlib.suppress(CdpError, ConnectionError, RuntimeError):
            await self.call(
                "Page.screencastFrameAck", {"sessionId": params["sessionId"]}, session=self._session
            )

    async def _frame_loop(self) -> None:
        # The last frames shown stay unacknowledged: with them and the next in flight the
        # browser makes no other, so it encodes about one frame per frame shown rather than
        # one per repaint. It skips repaints meanwhile, so when frames stop after it was at
        # its limit the cast is restarted, which makes it paint the page as it is now: the
        # picture never stays behind the page.
        shown: collections.deque[dict[str, Any]] = collections.deque()
        unsure = False
        while True:
            try:
                async with asyncio.timeout(max(0.5, 2 / self.fps) if unsure else None):
                    params = await self._frames.get()
            except TimeoutError:
                unsure = False
                shown.clear()  # the restarted cast forgets them
                await self._refresh()
                continue
            unsure = len(shown) >= HELD_FRAMES
            # Too soon for the viewers' rate: hold the frame until it is due, swapping in any
            # newer one.
            while (wait := 1 / self.fps - (time.monotonic() - self._last_sent)) > 0:
                try:
                    async with asyncio.timeout(wait):
                        newer = await self._frames.get()
                except TimeoutError:
                    break
                await self._ack(params)
                params = newer
            if self.dialog is not None:
                # The fields cannot be located while the page is stopped.
                await self._ack(params)
                continue
            try:
                found = await self.secret_fields_now()
                frame, cpu = await asyncio.to_thread(
                    _timed_mask,
                    base64.b64decode(params["data"]),
                    found["boxes"],
                    params.get("metadata") or {},
                )
            except CdpError:
                # The page between two documents: its fields cannot be located, so nothing of
                # this frame may be shown.
                await self._ack(params)
                continue
            shown.append(params)
            while len(shown) > HELD_FRAMES:
                await self._ack(shown.popleft())
            self._last_sent = time.monotonic()
            self.last_frame = frame
            self.frames_shown += 1
            self.mask_seconds += cpu
            await self.on_frame(frame)

    async def secret_fields_now(self) -> dict[str, Any]:
        """The boxes of secret fields now, and whether the focus is in one ('secret'), in a
        frame this code cannot read ('frame') or elsewhere ('')."""
        expression = (
            f"{_FIELD_SCAN}({json.dumps(self.secret_values)}, {json.dumps(self.secret_fields)})"
        )
        for _attempt in range(2):
            if self.dialog is not None:
                raise CdpError("a dialog is open on the page")
            if self._world is None:
                world = await self.call(
                    "Page.createIsolatedWorld",
                    {"frameId": self._main_frame, "worldName": "pandaweb-live"},
                    session=self._session,
                )
                self._world = int(world["executionContextId"])
            try:
                answer = await self.call(
                    "Runtime.evaluate",
                    {"expression": expression, "contextId": self._world, "returnByValue": True},
                    session=self._session,
                )
            except CdpError:
                self._world = None  # the document it belonged to is gone
                continue
            value = (answer.get("result") or {}).get("value")
            if isinstance(value, dict):
                return value
            self._world = None
        raise CdpError("the page's fields could not be read")

    # A person's input ----------------------------------------------------------------------

    async def click(self, x: float, y: float, *, button: str = "left") -> None:
        for kind in ("mousePressed", "mouseReleased"):
            await self.call(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": x, "y": y, "button": button, "clickCount": 1},
                session=self._session,
            )

    async def wheel(self, x: float, y: float, delta_x: float, delta_y: float) -> None:
        await self.call(
            "Input.dispatchMouseEvent",
            {"type": "mouseWheel", "x": x, "y": y, "deltaX": delta_x, "deltaY": delta_y},
            session=self._session,
        )

    async def key(self, key: str) -> None:
        """Press one key: a printable character types it; Enter, Tab, arrows and the like do
        what they do. Refuses (CdpError) a key the input line cannot express."""
        if key in _SPECIAL_KEYS:
            code = _SPECIAL_KEYS[key]
            text = _KEY_TEXT.get(key, "")
            down: dict[str, Any] = {
                "type": "keyDown" if text else "rawKeyDown",
                "key": key,
                "windowsVirtualKeyCode": code,
            }
            if text:
                down["text"] = text
        elif len(key) == 1 and key.isprintable():
            down = {"type": "keyDown", "key": key, "text": key}
        else:
            raise CdpError(f"the key {key!r} cannot be sent")
        await self.call("Input.dispatchKeyEvent", down, session=self._session)
        up = {k: v for k, v in down.items() if k != "text"} | {"type": "keyUp"}
        await self.call("Input.dispatchKeyEvent", up, session=self._session)
