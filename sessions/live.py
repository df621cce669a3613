"""The worker's half of the live view and take control: one feed per run it executes.

The feed lives where the run's browser is driven (the worker executing the run), in a thread
with an event loop of its own. It listens on the run's feed group for viewers (each says it is
there every few seconds) and for control requests; it casts the browser's screen only while
someone watches, a person has control, or the workflow keeps a filmstrip; it sends the masked
frames to the run's live group, where each viewer's consumer throttles them for its own page.

The runner calls :meth:`LiveFeed.hold` between steps (``runner.Pause``): a person who asked
for control gets it there, and the runner waits until they hand it back, or their connection
has been gone for ``CONTROL_LOST_SECONDS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from channels import DEFAULT_CHANNEL_LAYER
from channels.db import database_sync_to_async
from channels.layers import InMemoryChannelLayer, channel_layers, get_channel_layer
from django.conf import settings

from sessions.engine.filmstrip import filmstrip_append
from sessions.engine.last_frame import last_frame_forget, last_frame_keep
from sessions.engine.plan import HandBack
from sessions.engine.screencast import UNREADABLE_DIALOG, BrowserTap, CdpError, Dialog, Frame
from sessions.engine.vocabulary import MASK
from sessions.events import (
    LiveControl,
    LiveDialog,
    LiveFrame,
    LiveRefused,
    LiveStep,
    run_feed_group,
    run_live_group,
)
from sessions.layer import (
    layer_send,
    receive_group_on_this_loop,
    stop_receiving_group_on_this_loop,
)
from sessions.services.control import control_close, control_open, control_request_withdraw
from sessions.services.runstate import RunError, run_files_dir

logger = logging.getLogger(__name__)

# A viewer that has not said it is there for this long has gone (it says so every 2 s).
VIEWER_GONE_SECONDS = 6.0
# During control, one frame a second goes into the session's evidence.
CONTROL_FRAME_SECONDS = 1.0
# A browser that did not answer the live view is asked again after this long.
TAP_RETRY_SECONDS = 10.0
# Inputs a control session keeps; a person sending more is told so and the rest are refused.
CONTROL_MAX_INPUTS = 5000


@dataclass
class _Control:
    """A person's control of the browser, from the request to the hand-back."""

    user_id: int
    username: str
    channel: str
    state: str = "pending"
    # The control session is being opened in the database: a release now is a hand-back.
    opening: bool = False
    session_id: int | None = None
    files: Path | None = None
    inputs: list[dict[str, Any]] = field(default_factory=list)
    navigated: bool = False
    typed: bool = False
    urls: list[str] = field(default_factory=list)
    # The dialogs the page opened during the session and what became of each, in words.
    dialogs: list[str] = field(default_factory=list)
    frames: int = 0
    last_frame_at: float = 0.0
    lost_since: float | None = None
    done: threading.Event = field(default_factory=threading.Event)
    hand_back: HandBack | None = None


@dataclass(frozen=True)
class Filmstrip:
    seconds_per_frame: float
    max_bytes: int


class LiveFeed:
    """The live view of one executing run (``runner.Pause`` for its runner)."""

    def __init__(
        self,
        *,
        run_id: int,
        cdp_url: str,
        secret_values: list[str],
        secret_fields: list[dict[str, Any]],
        files_dir: Path,
        filmstrip: Filmstrip | None = None,
        time_scale: float = 1.0,
    ) -> None:
        self.run_id = run_id
        self.time_scale = time_scale
        self.cdp_url = cdp_url
        self.secret_values = secret_values
        self.secret_fields = secret_fields
        self.files_dir = files_dir
        self.filmstrip = filmstrip
        self.live_group = run_live_group(run_id)
        self.feed_group = run_feed_group(run_id)
        self.max_fps = float(settings.LIVE_MAX_FPS)
        self.lost_after = float(settings.CONTROL_LOST_SECONDS)
        self.step_index: int | None = None
        # The run's time limit (epoch seconds, 0 for none): control ends when it is reached.
        self.deadline = 0.0
        self._viewers: dict[str, float] = {}
        self._control: _Control | None = None
        self._requested = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._tap: BrowserTap | None = None
        self._tap_retry_at = 0.0
        # A person's clicks, scrolls and keys reach the browser one at a time, in order; an
        # answer to a dialog does not wait behind them (the click that opened it may).
        self._input_lock: asyncio.Lock | None = None
        self._film_bytes = 0
        self._film_count = 0
        self._film_last = 0.0

    @property
    def tap(self) -> BrowserTap | None:
        """The feed's CDP client of the browser (None before the feed starts)."""
        return self._tap

    # The worker's side -----------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name=f"live-{self.run_id}", daemon=True)
        self._thread.start()
        self._ready.wait(15)

    def stop(self) -> None:
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join(15)

    def hold(self, index: int, stop: Callable[[], str | None], deadline: float) -> HandBack | None:
        """``runner.Pause``: announce step ``index``; hand the browser to whoever asked for it
        and block until they give it back, ``stop`` gives a reason, or the run's time limit
        (``deadline``, epoch seconds; 0 for none) is reached."""
        self.deadline = deadline
        self._soon(self._announce_step(index))
        if not self._requested.is_set() or self._loop is None:
            return None
        if deadline and time.time() >= deadline:
            return None  # the run ends at its time limit; the request ends with the feed
        opened = asyncio.run_coroutine_threadsafe(self._open_control(index), self._loop)
        try:
            control = opened.result(30)
        except Exception:
            logger.exception("run %s: control could not be opened", self.run_id)
            return None
        if control is None:
            return None
        while not control.done.wait(0.25):
            reason = stop()
            if reason:
                reason = f"the run stopped: {reason}"
            elif deadline and time.time() >= deadline:
                reason = f"the run's time limit was reached while {control.username} had control"
            if reason:
                ended = asyncio.run_coroutine_threadsafe(self._close_control(reason), self._loop)
                with contextlib.suppress(Exception):
                    ended.result(30)
                break
        return control.hand_back

    def _soon(self, work: Coroutine[Any, Any, None]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            work.close()
            return
        asyncio.run_coroutine_threadsafe(work, loop)

    # The feed's loop ---------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except Exception:
            logger.exception("run %s: the live feed stopped", self.run_id)
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._input_lock = asyncio.Lock()
        layer = get_channel_layer()
        if layer is None:
            return
        if not isinstance(layer, InMemoryChannelLayer):
            # channels_redis receives on one event loop per layer instance, and a worker may
            # hold several runs' feeds, each on a loop of its own: each gets its own instance.
            layer = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)
        channel = await layer.new_channel("live.")
        await layer.group_add(self.feed_group, channel)
        receive_group_on_this_loop(self.feed_group)
        last_frame_forget(self.files_dir)
        self._tap = BrowserTap(
            self.cdp_url,
            secret_values=self.secret_values,
            secret_fields=self.secret_fields,
            on_frame=self._on_frame,
            on_navigated=self._on_navigated,
            on_dialog=self._on_dialog,
            time_scale=self.time_scale,
        )
        receiver = asyncio.create_task(self._receive(layer, channel))
        self._ready.set()
        try:
            await self._send_control()
            while not self._stopping.is_set():
                await self._tick()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.25):
                        await self._stopping.wait()
        finally:
            receiver.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await receiver
            if self._control is not None:
                await self._close_control("the run's worker stopped holding the browser")
            await self._send_control()
            frame = self._tap.last_frame
            if frame is not None:
                # Before the run settles: the page it then shows ("waiting for approval")
                # finds this picture of the browser.
                last_frame_keep(self.files_dir, frame.jpeg, at=frame.captured_at)
            with contextlib.suppress(Exception):
                await self._tap.close()
            await layer.group_discard(self.feed_group, channel)
            stop_receiving_group_on_this_loop(self.feed_group)

    async def _receive(self, layer: Any, channel: str) -> None:
        while True:
            message = await layer.receive(channel)
            try:
                await self._handle(message)
            except Exception:
                logger.exception("run %s: a live message failed", self.run_id)

    async def _handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "live.watching":
            channel = str(message["channel"])
            control = self._control
            if message.get("present"):
                fresh = channel not in self._viewers
                self._viewers[channel] = time.monotonic()
                if control is not None and control.channel == channel:
                    control.lost_since = None
                if fresh:
                    await self._greet(channel)
            else:
                self._viewers.pop(channel, None)
                if control is not None and control.channel == channel:
                    control.lost_since = time.monotonic()
        elif kind == "live.request":
            await self._request(message)

    async def _greet(self, channel: str) -> None:
        if self.step_index is not None:
            step: LiveStep = {"type": "live.step", "index": self.step_index}
            await layer_send(self.live_group, dict(step), channel=channel)
        await self._send_control(channel=channel)
        tap = self._tap
        if tap is not None and tap.dialog is not None and self._active() is not None:
            await self._send_dialog(tap.dialog, channel=channel)
        frame = self._tap.last_frame if self._tap is not None else None
        if frame is not None and self._tap is not None and self._tap.casting:
            await layer_send(self.live_group, _frame_message(frame), channel=channel)

    async def _tick(self) -> None:
        now = time.monotonic()
        for channel, seen in list(self._viewers.items()):
            if now - seen > VIEWER_GONE_SECONDS:
                del self._viewers[channel]
                control = self._control
                if control is not None and control.channel == channel and not control.lost_since:
                    control.lost_since = seen
        control = self._control
        lost = control.lost_since if control is not None else None
        if control is not None and lost is not None and now - lost >= self.lost_after:
            await self._close_control(
                f"{control.username}'s connection was lost for {int(self.lost_after)} s"
            )
        tap = self._tap
        if tap is None:
            return
        fps = 0.0
        if self._viewers:
            fps = self.max_fps
        elif self._control is not None and self._control.state == "active":
            fps = 1 / CONTROL_FRAME_SECONDS
        elif self.filmstrip is not None and self._film_bytes < self.filmstrip.max_bytes:
            fps = 1 / self.filmstrip.seconds_per_frame
        if fps and not tap.connected:
            # Connected only once someone needs frames: a second CDP client on the browser
            # costs it work on every navigation, and a slow browser (a microVM under software
            # emulation) is slower still for it.
            if now < self._tap_retry_at:
                return
            try:
                await tap.open()
            except CdpError as exc:
                self._tap_retry_at = now + TAP_RETRY_SECONDS
                logger.warning("run %s: no live view: %s", self.run_id, exc)
                return
        try:
            if fps and not tap.casting:
                await tap.start(fps=fps)
            elif fps:
                tap.fps = fps
            elif tap.casting:
                await tap.stop()
        except CdpError as exc:
            logger.info("run %s: screencast: %s", self.run_id, exc)

    # Frames ----------------------------------------------------------------------------------

    async def _on_frame(self, frame: Frame) -> None:
        now = time.monotonic()
        if self._viewers:
            await layer_send(self.live_group, _frame_message(frame))
        control = self._control
        if (
            control is not None
            and control.state == "active"
            and control.files is not None
            and now - control.last_frame_at >= CONTROL_FRAME_SECONDS
        ):
            control.last_frame_at = now
            control.frames += 1
            (control.files / f"frame-{control.frames:05d}.jpg").write_bytes(frame.jpeg)
        film = self.filmstrip
        if (
            film is not None
            and now - self._film_last >= film.seconds_per_frame
            and self._film_bytes + len(frame.jpeg) <= film.max_bytes
        ):
            self._film_last = now
            self._film_count += 1
            filmstrip_append(
                self.files_dir,
                number=self._film_count,
                jpeg=frame.jpeg,
                at=frame.captured_at,
                masks=frame.masks,
            )
            self._film_bytes += len(frame.jpeg)

    def _on_dialog(self, dialog: Dialog | None) -> None:
        """The page opened a dialog (or one closed). While a person has control, it is theirs
        to answer: they are shown it, and it goes into the session's inputs. Otherwise the
        runner answers it as its step says."""
        control = self._active()
        if control is None:
            return
        if dialog is not None:
            control.inputs.append(
                {
                    "at": _now(),
                    "kind": "dialog_opened",
                    "dialog": dialog.kind,
                    "message": self._scrub(dialog.message),
                }
            )
        loop = self._loop
        if loop is not None:
            loop.create_task(self._send_dialog(dialog))

    def _active(self) -> _Control | None:
        control = self._control
        return control if control is not None and control.state == "active" else None

    def _dialog_words(self, dialog: Dialog) -> str:
        if dialog is UNREADABLE_DIALOG:
            return "a dialog already open when the live view connected (its text unreadable)"
        return f"a {dialog.kind} dialog saying '{self._scrub(dialog.message)}'"

    def _scrub(self, text: str) -> str:
        text = " ".join(text.split())[:500]
        for secret in self.secret_values:
            if secret:
                text = text.replace(secret, MASK)
        return text

    def _on_navigated(self, url: str) -> None:
        control = self._control
        if control is not None and control.state == "active":
            control.navigated = True
            if url not in control.urls:
                control.urls.append(url)
            control.inputs.append({"at": _now(), "kind": "navigated", "url": url})

    async def _announce_step(self, index: int) -> None:
        self.step_index = index
        step: LiveStep = {"type": "live.step", "index": index}
        if self._viewers:
            await layer_send(self.live_group, dict(step))

    # Control ---------------------------------------------------------------------------------

    async def _request(self, message: dict[str, Any]) -> None:
        channel = str(message["channel"])
        user_id = int(message["user_id"])
        action = message.get("action")
        control = self._control
        if action == "take":
            if control is not None and control.user_id != user_id:
                await self._refuse(channel, f"{control.username} has control of this run")
                return
            if control is not None:
                # The same person again (a reloaded page): the control follows them.
                control.channel, control.lost_since = channel, None
            else:
                self._control = _Control(
                    user_id=user_id, username=str(message.get("username", "")), channel=channel
                )
                self._requested.set()
            await self._send_control()
            return
        if control is None or control.channel != channel or control.user_id != user_id:
            await self._refuse(channel, "you do not have control of this run")
            return
        if action == "release" and control.opening:
            # The session row exists or is about to: _open_control closes it when it sees this.
            self._control = None
            self._requested.clear()
            await self._send_control(note=f"{control.username} let go before control began")
        elif action == "release" and control.state == "pending":
            await self._withdraw(control)
        elif action == "release":
            await self._close_control(f"handed back by {control.username}")
        elif action == "input":
            data = dict(message.get("input") or {})
            if data.get("kind") == "dialog":
                await self._answer_dialog(control, data)
            else:
                # In a task: a click that opens a dialog may be answered only once the
                # dialog is, and the answer comes through this same receiver.
                assert self._loop is not None
                self._loop.create_task(self._input_in_order(control, data))

    async def _open_control(self, index: int) -> _Control | None:
        control = self._control
        if control is None:
            self._requested.clear()
            return None
        control.opening = True
        try:
            session = await database_sync_to_async(control_open)(
                run_id=self.run_id, user_id=control.user_id, step_index=index
            )
        except RunError as exc:
            self._control = None
            self._requested.clear()
            await self._refuse(control.channel, str(exc))
            await self._send_control()
            return None
        finally:
            control.opening = False
        if self._control is not control:
            # Let go while the session opened: it ends before the person has the browser, and
            # the trail says so (opened, then closed), not that a request was withdrawn.
            await database_sync_to_async(control_close)(
                session_id=session.pk,
                reason=f"{control.username} let go before control began",
                inputs=[], navigated=False, typed=False, urls=[], frames=0,
            )  # fmt: skip
            return None
        control.session_id = session.pk
        control.state = "active"
        control.files = run_files_dir(self.run_id) / session.files_dir
        control.files.mkdir(parents=True, exist_ok=True)
        await self._tick()
        await self._send_control()
        return control

    async def _withdraw(self, control: _Control) -> None:
        """The person who asked for control no longer wants it, before it began."""
        # Dropped before the database is asked: the runner's next pause finds no request.
        self._control = None
        self._requested.clear()
        await database_sync_to_async(control_request_withdraw)(
            run_id=self.run_id, user_id=control.user_id, during_step=self.step_index
        )
        await self._send_control(note=f"request withdrawn by {control.username}")

    async def _close_control(self, reason: str) -> None:
        control = self._control
        if control is None:
            return
        tap = self._tap
        if control.state == "active" and tap is not None and tap.dialog is not None:
            # Nobody answered it: the page must not stay stopped for the runner. One the tap
            # cannot read is left to the runner's browser connection, which saw it open: a
            # reload nobody asked for could send a form again.
            dialog = tap.dialog
            try:
                if dialog is UNREADABLE_DIALOG:
                    done = "left to the run when control ended"
                else:
                    await tap.answer_dialog(accept=False)
                    done = "dismissed when control ended"
            except CdpError as exc:
                done = f"could not be dismissed when control ended: {exc}"
            control.inputs.append(
                {"at": _now(), "kind": "dialog", "dialog": dialog.kind,
                 "message": self._scrub(dialog.message), "action": done}
            )  # fmt: skip
            control.dialogs.append(f"{self._dialog_words(dialog)} — {done}")
        self._control = None
        self._requested.clear()
        if control.session_id is not None:
            if control.files is not None:
                lines = "".join(json.dumps(entry) + "\n" for entry in control.inputs)
                (control.files / "inputs.jsonl").write_text(lines)
            await database_sync_to_async(control_close)(
                session_id=control.session_id,
                reason=reason,
                inputs=control.inputs,
                navigated=control.navigated,
                typed=control.typed,
                urls=control.urls,
                frames=control.frames,
            )
            control.hand_back = HandBack(
                by=control.username,
                inputs=sum(1 for entry in control.inputs if _by_the_person(entry)),
                navigated=control.navigated,
                typed=control.typed,
                urls=tuple(control.urls),
                dialogs=tuple(control.dialogs),
            )
        control.done.set()
        await self._send_control(note=reason)

    async def _input_in_order(self, control: _Control, data: dict[str, Any]) -> None:
        assert self._input_lock is not None
        async with self._input_lock:
            if self._control is not control:
                return  # control ended while this input waited its turn
            try:
                await self._input(control, data)
            except Exception:
                logger.exception("run %s: an input failed", self.run_id)

    async def _answer_dialog(self, control: _Control, data: dict[str, Any]) -> None:
        tap = self._tap
        if control.state != "active" or tap is None or tap.dialog is None:
            await self._refuse(control.channel, "no dialog is open on the page")
            return
        accept = data.get("accept") is True
        text = data.get("text")
        text = str(text)[:1000] if accept and isinstance(text, str) else None
        try:
            dialog = await tap.answer_dialog(accept=accept, text=text)
        except CdpError as exc:
            await self._refuse(control.channel, f"the dialog could not be answered: {exc}")
            return
        done = "accepted" if accept and dialog is not UNREADABLE_DIALOG else _dismissed(dialog)
        entry: dict[str, Any] = {
            "at": _now(), "kind": "dialog", "dialog": dialog.kind,
            "message": self._scrub(dialog.message), "action": done, "by": "person",
        }  # fmt: skip
        words = f"{self._dialog_words(dialog)} — {done}"
        if text is not None and dialog.kind == "prompt":
            entry["text"] = self._scrub(text)
            words += f" with '{self._scrub(text)}'"
            control.typed = True
        control.inputs.append(entry)
        control.dialogs.append(f"{words} by {control.username}")
        await self._send_dialog(None)

    async def _input(self, control: _Control, data: dict[str, Any]) -> None:
        tap, frame = self._tap, self._tap.last_frame if self._tap is not None else None
        if control.state != "active" or tap is None:
            await self._refuse(control.channel, "control starts when the current step ends")
            return
        if len(control.inputs) >= CONTROL_MAX_INPUTS:
            await self._refuse(control.channel, "this control session has had enough input")
            return
        if tap.dialog is not None:
            await self._refuse(control.channel, "the page shows a dialog: answer it first")
            return
        kind = data.get("kind")
        try:
            if kind in ("click", "wheel"):
                if frame is None:
                    await self._refuse(control.channel, "no picture of the page yet")
                    return
                x = _fraction(data.get("x")) * frame.device_width
                y = _fraction(data.get("y")) * frame.device_height
                if kind == "click":
                    # On record first: a dialog the click opens comes after it.
                    click: dict[str, Any] = {"at": _now(), "kind": "click", "x": x, "y": y}
                    control.inputs.append(click)
                    try:
                        await tap.click(x, y)
                    except CdpError as exc:
                        click["failed"] = str(exc)
                        raise
                else:
                    dx, dy = _delta(data.get("dx")), _delta(data.get("dy"))
                    await tap.wheel(x, y, dx, dy)
                    control.inputs.append(
                        {"at": _now(), "kind": "scroll", "x": x, "y": y, "dx": dx, "dy": dy}
                    )
            elif kind == "key":
                key = str(data.get("key", ""))[:20]
                focus = (await tap.secret_fields_now())["focus"]
                if focus:
                    why = (
                        "the focused field is one the workflow marks secret: only the run "
                        "types into it"
                        if focus == "secret"
                        else "typing into an embedded frame is not possible while in control"
                    )
                    control.inputs.append({"at": _now(), "kind": "key", "refused": why})
                    await self._refuse(control.channel, why)
                    return
                await tap.key(key)
                control.typed = True
                control.inputs.append({"at": _now(), "kind": "key", "key": key})
            else:
                await self._refuse(control.channel, "unknown input")
        except (CdpError, ValueError) as exc:
            await self._refuse(control.channel, f"that input did not reach the browser: {exc}")

    # Messages to viewers -----------------------------------------------------------------------

    async def _send_control(self, *, channel: str = "", note: str = "") -> None:
        control = self._control
        active = control is not None and control.state == "active"
        message: LiveControl = {
            "type": "live.control",
            "state": "none" if control is None else control.state,  # type: ignore[typeddict-item]
            "user_id": None if control is None else control.user_id,
            "username": "" if control is None else control.username,
            "note": note,
            # Counted down by the page on its own stopwatch (its clock may be set wrong).
            "seconds_left": max(0, int(self.deadline - time.time()))
            if active and self.deadline
            else None,
        }
        await layer_send(self.live_group, dict(message), channel=channel)

    async def _send_dialog(self, dialog: Dialog | None, *, channel: str = "") -> None:
        message: LiveDialog = {
            "type": "live.dialog",
            "kind": "" if dialog is None else dialog.kind,  # type: ignore[typeddict-item]
            "message": "" if dialog is None else self._scrub(dialog.message),
            "default_prompt": "" if dialog is None else self._scrub(dialog.default_prompt),
        }
        await layer_send(self.live_group, dict(message), channel=channel)

    async def _refuse(self, channel: str, reason: str) -> None:
        refused: LiveRefused = {"type": "live.refused", "reason": reason}
        await layer_send(self.live_group, dict(refused), channel=channel)


def _frame_message(frame: Frame) -> dict[str, Any]:
    message: LiveFrame = {
        "type": "live.frame",
        "jpeg": frame.jpeg,
        "width": frame.width,
        "height": frame.height,
        "device_width": frame.device_width,
        "device_height": frame.device_height,
        "captured_at": frame.captured_at,
        "masks": frame.masks,
    }
    return dict(message)


def _by_the_person(entry: dict[str, Any]) -> bool:
    """An input the person made (not a page going elsewhere or opening a dialog by itself)."""
    if entry["kind"] == "dialog":
        return entry.get("by") == "person"
    return entry["kind"] in ("click", "scroll", "key")


def _fraction(value: Any) -> float:
    number = float(value)
    if not 0.0 <= number <= 1.0:
        raise ValueError("a point outside the picture")
    return number


def _delta(value: Any) -> float:
    return max(-2000.0, min(2000.0, float(value or 0)))


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _dismissed(dialog: Dialog) -> str:
    return "dismissed by reloading the page" if dialog is UNREADABLE_DIALOG else "dismissed"
