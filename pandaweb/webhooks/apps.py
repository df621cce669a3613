from __future__ import annotations

from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "pandaweb.webhooks"
    label = "webhooks"
    verbose_name = "Webhooks"

    def ready(self) -> None:
        # Registers the app's tasks (services queue them by name, task_named) and connects its
        # receivers of what the run core announces.
        from pandaweb.webhooks import receivers, tasks  # noqa: F401
