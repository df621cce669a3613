from __future__ import annotations

from django.apps import AppConfig


class RunSessionsConfig(AppConfig):
    """Runs and their browser sessions.

    The label is ``runs`` because ``django.contrib.sessions`` owns the label ``sessions``; it is
    fixed before the first migration and must never change (tables and permissions carry it).
    """

    name = "sessions"
    label = "runs"
    verbose_name = "Runs"

    def ready(self) -> None:
        # Registers the app's tasks, which services below them queue by name (task_named).
        from sessions import tasks  # noqa: F401
