from __future__ import annotations

from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals"

    def ready(self) -> None:
        # Registers the app's tasks, which services below them queue by name (task_named).
        from approvals import tasks  # noqa: F401
