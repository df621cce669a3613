from __future__ import annotations

from django.apps import AppConfig


class SchedulesConfig(AppConfig):
    name = "pandaweb.schedules"
    label = "schedules"
    verbose_name = "Schedules and batches"
