from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.contrib.auth import get_user_model
from django.template.loader import render_to_string

from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability
from sessions.events import RUNS_GROUP, RunChanged, RunEventsAvailable, run_group
from sessions.models import Run
from sessions.rendering import Viewer, message_for
from sessions.selectors import run_events_after, run_list


@database_sync_to_async
def _may_view_runs(scope_user: Any) -> bool:
    if scope_user is None or not scope_user.is_authenticated:
        return False
    # A fresh copy: the scope's user caches permissions from the handshake.
    user = get_user_model().objects.filter(pk=scope_user.pk).first()
    return user is not None and user_can(user, Capability.VIEW_RUNS)


class RunConsumer(AsyncWebsocketConsumer):
    """Streams one run's events. The client says the last sequence number it has
    (``?after=N``) and first receives everything after it from the database."""

    run_id: int
    sent: int

    async def connect(self) -> None:
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        if not await _may_view_runs(self.scope.get("user")) or not await self._exists():
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
        if not await _may_view_runs(self.scope.get("user")):
            await self.close()
            return
        await self._replay()

    async def _replay(self) -> None:
        # One replay at a time, so two notifications never send an event twice.
        async with self._lock:
            while True:
                messages = await self._messages_after(self.sent)
                if not messages:
                    return
                for message in messages:
                    await self.send(text_data=json.dumps(message))
                    self.sent = message["seq"]

    @database_sync_to_async
    def _messages_after(self, seq: int) -> list[dict[str, Any]]:
        scope_user = self.scope.get("user")
        user_id = getattr(scope_user, "pk", None)
        user = get_user_model().objects.filter(pk=user_id).first() if user_id else None
        # The fragments carry the buttons and links only for people who may use them.
        viewer = Viewer.of(user)
        events = run_events_after(self.run_id, seq)
        return [message_for(event, viewer) for event in events]

    @database_sync_to_async
    def _exists(self) -> bool:
        return Run.objects.filter(pk=self.run_id).exists()


class RunListConsumer(AsyncWebsocketConsumer):
    """Keeps the runs list live: any run change re-renders the table."""

    async def connect(self) -> None:
        if not await _may_view_runs(self.scope.get("user")):
            await self.close()
            return
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
        await self.send(text_data=await self._table())

    @database_sync_to_async
    def _table(self) -> str:
        return render_to_string(
            "sessions/partials/_run_table.html", {"runs": run_list(), "oob": True}
        )
