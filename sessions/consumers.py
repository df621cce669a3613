from __future__ import annotations

import asyncio
import json
import struct
import time
from typing import Any, Literal
from urllib.parse import parse_qs

from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.auth import get_user_model
from django.template.loader import render_to_string

from approvals.events import PENDING_GROUP, PendingChanged
from pandaweb.core.consumers import read_only
from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability
from sessions.console import RunFilter, needs_counts, run_matches, run_row
from sessions.events import (
    RUNS_GROUP,
    LiveControl,
    LiveDialog,
    LiveFrame,
    LiveRefused,
    LiveRequest,
    LiveStep,
    LiveWatching,
    QueueChanged,
    RunChanged,
    RunEventsAvailable,
    queue_group,
    run_feed_group,
    run_group,
    run_live_group,
)
from sessions.layer import layer_send, receive_group_on_this_loop
from sessions.models import Run
from sessions.rendering import Viewer, messages_for, queue_context
from sessions.selectors import run_events_after, runs_visible_to
from sessions.services.control import control_unavailable


def _fresh(scope_user: Any) -> Any:
    """The signed-in person afresh (None for anyone else): the scope's user caches permissions
    and team roles from the handshake, and a role taken away must end the stream."""
    if scope_user is None or not scope_user.is_authenticated:
        return None
    return get_user_model().objects.filter(pk=scope_user.pk).first()


def _can_view_runs(scope_user: Any) -> bool:
    user = _fresh(scope_user)
    return user is not None and user_can(user, Capability.VIEW_RUNS)


_may_view_runs = read_only(_can_view_runs)


def _can_view_run(scope_user: Any, run_id: int) -> bool:
    """Whether this person may watch the run: it is one of their teams' (another team's run is
    refused like one that does not exist)."""
    user = _fresh(scope_user)
    return user is not None and runs_visible_to(user).filter(pk=run_id).exists()


_may_view_run = read_only(_can_view_run)


class RunConsumer(AsyncWebsocketConsumer):
    """Streams one run's events. The client says the last sequence number it has
    (``?after=N``) and first receives everything after it from the database."""

    run_id: int
    sent: int

    async def connect(self) -> None:
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        if not await _may_view_run(self.scope.get("user"), self.run_id):
            await self.close()
            return
        query = parse_qs(self.scope.get("query_string", b"").decode())
        try:
            self.sent = max(0, int(query.get("after", ["0"])[0]))
        except ValueError:
            self.sent = 0
        self._lock = asyncio.Lock()
        await self.channel_layer.group_add(run_group(self.run_id), self.channel_name)
        await self.accept()
        await self._replay()

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "run_id"):
            await self.channel_layer.group_discard(run_group(self.run_id), self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        return  # read-only stream

    async def run_events(self, event: RunEventsAvailable) -> None:
        await self._replay()

    async def _replay(self) -> None:
        # One replay at a time, so two notifications never send an event twice.
        async with self._lock:
            while True:
                messages = await self._messages_after(self.sent)
                if messages is None:
                    await self.close()
                    return
                if not messages:
                    return
                for message in messages:
                    await self.send(text_data=json.dumps(message))
                    self.sent = message["seq"]

    @read_only
    def _messages_after(self, seq: int) -> list[dict[str, Any]] | None:
        """The updates after ``seq``, or None once this person may no longer see the run (a
        team taken away): the check and the read are one trip to daphne's database thread."""
        user = _fresh(self.scope.get("user"))
        if user is None:
            return None
        visible = runs_visible_to(user).filter(pk=self.run_id)
        team = visible.values_list("team_id", flat=True).first()
        if team is None:
            return None
        # The fragments carry the buttons and links only for people who may use them.
        events = list(run_events_after(self.run_id, seq))
        return messages_for(self.run_id, events, Viewer.of(user, team_id=team))


class RunListConsumer(AsyncWebsocketConsumer):
    """Keeps the runs list live: a changed run's row is re-rendered and swapped in place, and on
    the first page (``?newer_than=N`` and the list's filters) a new run that matches the filters
    is put on top."""

    newer_than: int | None = None
    flt: RunFilter
    shown: set[int]

    async def connect(self) -> None:
        if not await _may_view_runs(self.scope.get("user")):
            await self.close()
            return
        raw_query = parse_qs(self.scope.get("query_string", b"").decode())
        query = {key: values[-1] for key, values in raw_query.items()}
        raw = query.pop("newer_than", "")
        if raw.isdigit():
            self.newer_than = int(raw)
            self.flt = RunFilter.from_params(query)
            self.shown = set()
        await self.channel_layer.group_add(RUNS_GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(RUNS_GROUP, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        return

    async def runs_changed(self, event: RunChanged) -> None:
        if not await _may_view_runs(self.scope.get("user")):
            await self.close()
            return
        row = await self._row(event["run_id"])
        if row:
            await self.send(text_data=row)

    @read_only
    def _row(self, run_id: int) -> str:
        # Only the changed row, swapped by id: a filtered, sorted or paged list keeps its
        # filters and its page; a row that is not on screen is simply not there to swap.
        # The group hears of every team's runs: another team's is never rendered here.
        user = _fresh(self.scope.get("user"))
        if user is None:
            return ""
        new = (
            self.newer_than is not None
            and run_id > self.newer_than
            and run_id not in self.shown
            and run_matches(self.flt, run_id, user=user)
        )
        run = run_row(run_id, user=user)
        if run is None:
            return ""
        if new:
            self.shown.add(run_id)
        return render_to_string("sessions/partials/_run_row_live.html", {"run": run, "new": new})


class HomeCountsConsumer(AsyncWebsocketConsumer):
    """The home page's live counts: re-read from the database whenever a run or the approval
    queue changes (the messages carry no numbers, so a late or doubled one shows no stale
    count)."""

    groups_joined = (RUNS_GROUP, PENDING_GROUP)

    async def connect(self) -> None:
        if not await _may_view_runs(self.scope.get("user")):
            await self.close()
            return
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        return

    async def runs_changed(self, event: RunChanged) -> None:
        await self._send_counts()

    async def approvals_pending_changed(self, event: PendingChanged) -> None:
        await self._send_counts()

    async def _send_counts(self) -> None:
        if not await _may_view_runs(self.scope.get("user")):
            await self.close()
            return
        await self.send(text_data=await self._counts())

    @read_only
    def _counts(self) -> str:
        # Counted for this person's teams as they are now.
        user = _fresh(self.scope.get("user"))
        return render_to_string(
            "core/partials/_home_counts.html", {"counts": needs_counts(user), "oob": True}
        )


class RunQueueConsumer(AsyncWebsocketConsumer):
    """A waiting run's place in its workflow's queue ("queued, 3 ahead"), re-read whenever that
    queue moves. The messages carry no numbers, so a late or doubled one never shows a stale
    place; the run's own status changes come through RunConsumer."""

    run_id: int
    group: str

    async def connect(self) -> None:
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        workflow_id = await self._workflow_id()
        if not await _may_view_run(self.scope.get("user"), self.run_id) or workflow_id is None:
            await self.close()
            return
        self.group = queue_group(workflow_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send(text_data=await self._place())

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        return

    async def queue_changed(self, event: QueueChanged) -> None:
        if not await _may_view_run(self.scope.get("user"), self.run_id):
            await self.close()
            return
        await self.send(text_data=await self._place())

    @read_only
    def _workflow_id(self) -> int | None:
        return Run.objects.filter(pk=self.run_id).values_list("workflow_id", flat=True).first()

    @read_only
    def _place(self) -> str:
        run = Run.objects.select_related("workflow").get(pk=self.run_id)
        return render_to_string("sessions/partials/_run_queue.html", queue_context(run))


@read_only
def _may_control_run(scope_user: Any, run_id: int) -> bool:
    """Whether this person may take control of the run's browser: CONTROL_RUNS in its team."""
    user = _fresh(scope_user)
    team_id = Run.objects.filter(pk=run_id).values_list("team_id", flat=True).first()
    return (
        user is not None
        and team_id is not None
        and user_can(user, Capability.CONTROL_RUNS, team_id=team_id)
    )


class LiveConsumer(AsyncWebsocketConsumer):
    """The run's browser, live (``/ws/runs/<id>/live/?fps=N``), and its take-control requests.

    Says every two seconds to the worker holding the browser that a viewer is here (so the
    worker casts only while someone watches), and sends this viewer at most ``fps`` of the
    frames it gets. A request for control, or an input, is forwarded only for a person with the
    control capability, checked afresh per message; anyone else gets a refusal.

    A frame is one binary message: its header's length (4 bytes, big-endian), the header (JSON:
    size, the page's CSS size, capture time, masks) and the JPEG as the worker masked it, so
    the bytes are neither base64-encoded here nor decoded from text by the page. Everything
    else is a JSON text message.
    """

    PRESENCE_SECONDS = 2.0
    # Frames come several a second: permission is re-read at most this often for them.
    FRAME_RECHECK_SECONDS = 1.0

    run_id: int

    async def connect(self) -> None:
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        user = self.scope.get("user")
        if not await _may_view_run(user, self.run_id):
            await self.close()
            return
        query = parse_qs(self.scope.get("query_string", b"").decode())
        most = float(settings.LIVE_MAX_FPS)
        try:
            fps = float(query.get("fps", [str(most)])[0])
        except ValueError:
            fps = most
        self.interval = 1 / max(0.2, min(fps, most))
        self.last_frame = 0.0
        self.checked_at = time.monotonic()
        self.live_group = run_live_group(self.run_id)
        self.feed_group = run_feed_group(self.run_id)
        await self.channel_layer.group_add(self.live_group, self.channel_name)
        receive_group_on_this_loop(self.live_group)
        await self.accept()
        self.presence = asyncio.create_task(self._say_present())

    async def disconnect(self, code: int) -> None:
        if not hasattr(self, "presence"):
            return
        self.presence.cancel()
        await self._watching(present=False)
        await self.channel_layer.group_discard(self.live_group, self.channel_name)

    async def _say_present(self) -> None:
        while True:
            await self._watching(present=True)
            await asyncio.sleep(self.PRESENCE_SECONDS)

    async def _watching(self, *, present: bool) -> None:
        user = self.scope["user"]
        message: LiveWatching = {
            "type": "live.watching",
            "channel": self.channel_name,
            "user_id": user.pk,
            "present": present,
        }
        await layer_send(self.feed_group, dict(message))

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            data = json.loads(text_data or "")
        except ValueError:
            return await self._refused("a message this page does not understand")
        if not isinstance(data, dict) or data.get("type") not in ("control", "input"):
            return await self._refused("a message this page does not understand")
        user = self.scope.get("user")
        if not await _may_view_run(user, self.run_id):
            await self.close()
            return
        if not await _may_control_run(user, self.run_id):
            return await self._refused("You may watch this run but not take control of it.")
        action: Literal["take", "release", "input"]
        if data["type"] == "input":
            action = "input"
        elif data.get("action") in ("take", "release"):
            action = data["action"]
        else:
            return await self._refused("a message this page does not understand")
        if action == "take" and (unavailable := await self._control_unavailable()):
            # Nobody holds the browser to hear the request: the run waits or has ended.
            return await self._refused(unavailable)
        request: LiveRequest = {
            "type": "live.request",
            "channel": self.channel_name,
            "user_id": user.pk,
            "username": user.get_username(),
            "action": action,
            "input": dict(data.get("input") or {}) if action == "input" else {},
        }
        await layer_send(self.feed_group, dict(request))

    async def _refused(self, reason: str) -> None:
        await self.send(text_data=json.dumps({"type": "refused", "reason": reason}))

    @read_only
    def _control_unavailable(self) -> str:
        return control_unavailable(Run.objects.only("status").get(pk=self.run_id))

    async def live_frame(self, event: LiveFrame) -> None:
        now = time.monotonic()
        if now - self.last_frame < self.interval:
            return  # this viewer's rate: the next frame will do
        if now - self.checked_at >= self.FRAME_RECHECK_SECONDS:
            if not await _may_view_run(self.scope.get("user"), self.run_id):
                await self.close()
                return
            self.checked_at = now
        self.last_frame = now
        await self.send(bytes_data=frame_message(event))

    async def live_step(self, event: LiveStep) -> None:
        await self.send(text_data=json.dumps({"type": "step", "index": event["index"]}))

    async def live_control(self, event: LiveControl) -> None:
        if not await _may_view_run(self.scope.get("user"), self.run_id):
            await self.close()
            return
        message = {key: value for key, value in event.items() if key != "type"}
        await self.send(text_data=json.dumps({"type": "control", **message}))

    async def live_dialog(self, event: LiveDialog) -> None:
        if not await _may_view_run(self.scope.get("user"), self.run_id):
            await self.close()
            return
        message = {key: value for key, value in event.items() if key != "type"}
        await self.send(text_data=json.dumps({"type": "dialog", **message}))

    async def live_refused(self, event: LiveRefused) -> None:
        await self._refused(event["reason"])


def frame_message(event: LiveFrame) -> bytes:
    """A frame as the live view's binary websocket message (see ``LiveConsumer``)."""
    header = json.dumps(
        {key: value for key, value in event.items() if key not in ("type", "jpeg")}
    ).encode()
    return struct.pack(">I", len(header)) + header + event["jpeg"]
