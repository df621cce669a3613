from __future__ import annotations

from django.apps import AppConfig


class SchedulesConfig(AppConfig):
    name = "pandaweb.schedules"
    label = "schedules"
    verbose_name = "Schedules and batches"

    def ready(self) -> None:
        # Registers the app's tasks, which services below them queue by name (task_named).
        from pandaweb.schedules import tasks  # noqa: F401
