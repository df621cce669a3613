from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from pandaweb.schedules.models import Batch, Schedule


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin[Schedule]):
    list_display = ["id", "name", "workflow", "cron", "timezone", "paused", "next_fire_at"]
    list_filter = ["paused"]

    def has_change_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        # Changes go through the schedule services, which check the inputs and audit them.
        return False


@admin.register(Batch)
class BatchAdmin(admin.ModelAdmin[Batch]):
    list_display = ["id", "workflow", "filename", "created_by", "created_at"]

    def has_change_permission(self, request: HttpRequest, obj: Batch | None = None) -> bool:
        return False
