from __future__ import annotations

from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "pandaweb.audit"
    label = "audit"
    verbose_name = "Audit trail"

    def ready(self) -> None:
        from pandaweb.audit import (
            signals,  # noqa: F401  (connects the receivers)
            tasks,  # noqa: F401  (registers the tasks, queued by name)
        )
