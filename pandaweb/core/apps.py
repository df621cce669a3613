from __future__ import annotations

from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "pandaweb.core"
    label = "core"
    verbose_name = "pandaweb"

    def ready(self) -> None:
        # Registers the app's tasks, which services below them queue by name (task_named).
        from pandaweb.core import tasks  # noqa: F401
