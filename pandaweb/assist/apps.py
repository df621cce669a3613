from __future__ import annotations

from django.apps import AppConfig


class AssistConfig(AppConfig):
    name = "pandaweb.assist"
    label = "assist"
    verbose_name = "Model assistance"

    def ready(self) -> None:
        # Registers the app's task, which its services queue by name (task_named).
        from pandaweb.assist import tasks  # noqa: F401
