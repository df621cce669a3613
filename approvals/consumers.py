from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.contrib.auth import get_user_model
from django.template.loader import render_to_string

from approvals.events import PENDING_GROUP, PendingChanged
from approvals.selectors import approval_pending_count
from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability


class NavigationConsumer(AsyncWebsocketConsumer):
    """Keeps the navigation's pending-approvals badge live for people who may see approvals."""

    async def connect(self) -> None:
        if not await self._may_see_approvals():
            await self.close()
            return
        await self.channel_layer.group_add(PENDING_GROUP, self.channel_name)
        await self.accept()
        await self._send_badge()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(PENDING_GROUP, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        # The badge socket only listens; anything a client sends is ignored.
        return

    async def approvals_pending_changed(self, event: PendingChanged) -> None:
        # Roles can change while a tab stays open: re-check on every message.
        if not await self._may_see_approvals():
            await self.close()
            return
        await self._send_badge()

    async def _send_badge(self) -> None:
        html = await database_sync_to_async(self._render_badge)()
        await self.send(text_data=html)

    def _render_badge(self) -> str:
        return render_to_string(
            "approvals/partials/_badge.html",
            {"approvals_pending_count": approval_pending_count(), "oob": True},
        )

    @database_sync_to_async
    def _may_see_approvals(self) -> bool:
        scope_user: Any = self.scope.get("user")
        if scope_user is None or not scope_user.is_authenticated:
            return False
        # A fresh copy: the scope's user object caches its permissions from the handshake.
        user = get_user_model().objects.filter(pk=scope_user.pk).first()
        return user is not None and user_can(user, Capability.VIEW_APPROVALS)
