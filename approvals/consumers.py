from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncWebsocketConsumer
from django.contrib.auth import get_user_model
from django.template.loader import render_to_string

from approvals.events import PENDING_GROUP, PendingChanged
from approvals.selectors import needs_badge
from pandaweb.core.consumers import read_only


class NavigationConsumer(AsyncWebsocketConsumer):
    """Keeps the navigation's badge live: the pending approvals for people who see the queue,
    and the questions runs ask this person (anyone who watches runs may be asked)."""

    async def connect(self) -> None:
        html = await self._badge()
        if html is None:
            await self.close()
            return
        await self.channel_layer.group_add(PENDING_GROUP, self.channel_name)
        await self.accept()
        await self.send(text_data=html)

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(PENDING_GROUP, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        # The badge socket only listens; anything a client sends is ignored.
        return

    async def approvals_pending_changed(self, event: PendingChanged) -> None:
        # Questions and approvals both announce themselves here; the message carries no count.
        await self._send_badge()

    async def _send_badge(self) -> None:
        # Roles can change while a tab stays open: re-checked on every message.
        html = await self._badge()
        if html is None:
            await self.close()
            return
        await self.send(text_data=html)

    @read_only
    def _badge(self) -> str | None:
        """The badge for this person now, or None when they may see neither approvals nor
        runs."""
        scope_user: Any = self.scope.get("user")
        if scope_user is None or not scope_user.is_authenticated:
            return None
        # A fresh copy: the scope's user object caches its permissions from the handshake.
        user = get_user_model().objects.filter(pk=scope_user.pk).first()
        if user is None:
            return None
        badge = needs_badge(user)
        if not badge.on:
            return None
        return render_to_string("approvals/partials/_badge.html", {"badge": badge, "oob": True})
