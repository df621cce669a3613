from __future__ import annotations

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from pandaweb.webhooks.models import Message, Subscription


def subscription_get(subscription_id: int) -> Subscription:
    return get_object_or_404(
        Subscription.objects.select_related("workflow", "created_by"), pk=subscription_id
    )


def subscriptions() -> QuerySet[Subscription]:
    """The installation's subscriptions (not the callbacks of single runs)."""
    return Subscription.objects.filter(run__isnull=True).select_related("workflow", "created_by")


def message_get(message_id: int) -> Message:
    return get_object_or_404(
        Message.objects.select_related("subscription", "subscription__workflow"), pk=message_id
    )


def messages(*, subscription_id: int | None = None, status: str = "") -> QuerySet[Message]:
    found = Message.objects.select_related("subscription")
    if subscription_id:
        found = found.filter(subscription_id=subscription_id)
    if status in Message.Status.values:
        found = found.filter(status=status)
    return found.order_by("-created_at", "-pk")


def message_keyset(
    *, subscription_id: int | None, status: str, before_id: int | None, limit: int
) -> list[Message]:
    """Up to ``limit`` messages, newest first, with ids below ``before_id``: keyset pagination on
    the primary key, so a page never shifts while events are recorded."""
    found = messages(subscription_id=subscription_id, status=status).order_by("-pk")
    if before_id is not None:
        found = found.filter(pk__lt=before_id)
    return list(found[:limit])
