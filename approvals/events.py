"""Messages about approvals sent to dashboards over the channel layer."""

from __future__ import annotations

from typing import Literal, TypedDict

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

# Every dashboard of a person who may see approvals joins this group for the navigation badge.
PENDING_GROUP = "approvals.pending"


class PendingChanged(TypedDict):
    type: Literal["approvals.pending_changed"]


def publish_pending_changed() -> None:
    """Tell every open dashboard to refresh its pending-approvals badge, after commit.

    The message carries no count: each consumer reads it from the database, so a message that
    arrives late or twice can never show a stale number.
    """
    message: PendingChanged = {"type": "approvals.pending_changed"}

    def send() -> None:
        layer = get_channel_layer()
        if layer is not None:
            async_to_sync(layer.group_send)(PENDING_GROUP, message)

    transaction.on_commit(send)
