from __future__ import annotations

from django.db import models

from pandaweb.core.roles import CAPABILITY_LABELS


class Capability(models.Model):
    """Holder of the capability permissions; it has no table.

    Django attaches permissions to a model's content type. This unmanaged model gives the
    capabilities of ``pandaweb.core.roles`` one stable home, independent of the apps that use them.
    """

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [(cap.value, label) for cap, label in CAPABILITY_LABELS.items()]

    def __str__(self) -> str:
        return "capabilities"


class WorkerHeartbeat(models.Model):
    """The last time each worker (Celery process or in-process thread pool) answered a ping."""

    class Mode(models.TextChoices):
        THREAD = "thread", "In-process thread"
        CELERY = "celery", "Celery worker"

    worker = models.CharField(max_length=200, unique=True)
    mode = models.CharField(max_length=10, choices=Mode.choices)
    pid = models.PositiveIntegerField()
    database_vendor = models.CharField(max_length=40)
    seen_at = models.DateTimeField()
    ping_nonce = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-seen_at"]

    def __str__(self) -> str:
        return f"{self.worker} ({self.get_mode_display()})"
