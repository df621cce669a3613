from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from pandaweb.audit.models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin[AuditEvent]):
    """Read-only: events are written by ``audit_record`` alone, and the table refuses edits."""

    list_display = ["sequence", "occurred_at", "actor_label", "action", "object_type", "object_id"]
    list_filter = ["actor_kind", "action"]
    search_fields = ["action", "object_type", "object_id", "actor_label", "request_id"]
    ordering = ["-sequence"]
    # A select box would list every user; the label is what the event recorded anyway.
    raw_id_fields = ["actor"]
    list_select_related = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
