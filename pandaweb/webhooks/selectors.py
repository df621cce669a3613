from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from pandaweb.core.permissions import in_teams
from pandaweb.core.roles import Capability
from pandaweb.webhooks.models import Message, Subscription

# Webhooks are managed by those who see the system (admins, for every team).
MANAGE = Capability.VIEW_SYSTEM


def _subscriptions_of(user: Any) -> QuerySet[Subscription]:
    return in_teams(Subscription.objects.all(), user, MANAGE)


def subscription_get(subscription_id: int, *, user: Any) -> Subscription:
    """The subscription or 404, also for another team's."""
    return get_object_or_404(
        _subscriptions_of(user).select_related("workflow", "created_by", "team"),
        pk=subscription_id,
    )


def subscriptions(user: Any) -> QuerySet[Subscription]:
    """The subscriptions of ``user``'s teams (not the callbacks of single runs)."""
    return (
        _subscriptions_of(user)
        .filter(run__isnull=True)
        .select_related("workflow", "created_by", "team")
    )


def message_get(message_id: int, *, user: Any) -> Message:
    messages = in_teams(Message.objects.all(), user, MANAGE, via="subscription__team")
    return get_object_or_404(
        messages.select_related("subscription", "subscription__workflow"), pk=message_id
    )


def messages(
    *, user: Any, subscription_id: int | None = None, status: str = ""
) -> QuerySet[Message]:
    found = in_teams(Message.objects.all(), user, MANAGE, via="subscription__team")
    found = found.select_related("subscription")
    if subscription_id:
        found = found.filter(subscription_id=subscription_id)
    if status in Message.Status.values:
        found = found.filter(status=status)
    return found.order_by("-created_at", "-pk")


def message_keyset(
    *, user: Any, subscription_id: int | None, status: str, before_id: int | None, limit: int
) -> list[Message]:
    """Up to ``limit`` messages of ``user``'s teams, newest first, with ids below ``before_id``:
    keyset pagination on the primary key, so a page never shifts while events are recorded."""
    found = messages(user=user, subscription_id=subscription_id, status=status).order_by("-pk")
    if before_id is not None:
        found = found.filter(pk__lt=before_id)
    return list(found[:limit])
