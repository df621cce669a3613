from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from pandaweb.webhooks.models import Message, Subscription


@admin.register(Subscription)
class SubscriptionAdmin(admin.ModelAdmin[Subscription]):
    list_display = ["id", "name", "url", "workflow", "active", "consecutive_failures"]
    list_filter = ["active"]
    exclude = ["secret_sealed"]

    def has_change_permission(self, request: HttpRequest, obj: Subscription | None = None) -> bool:
        # Changes go through the webhook services, which audit them (the Webhooks pages).
        return False


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin[Message]):
    list_display = ["id", "event", "subscription", "status", "attempts", "created_at"]
    list_filter = ["status", "event"]

    def has_change_permission(self, request: HttpRequest, obj: Message | None = None) -> bool:
        return False
