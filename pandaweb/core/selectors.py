from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import QuerySet

from pandaweb.core.models import WorkerHeartbeat


def heartbeat_list() -> QuerySet[WorkerHeartbeat]:
    return WorkerHeartbeat.objects.order_by("-seen_at")


def deployment_summary() -> dict[str, Any]:
    """What this installation runs on, for the system page and the quick start banner."""
    layer = str(settings.CHANNEL_LAYERS["default"]["BACKEND"]).rsplit(".", 1)[-1]
    return {
        "database": connection.vendor,
        "channel_layer": layer,
        "execution": settings.RUN_EXECUTION,
        "run_threads": settings.RUN_THREADS if settings.RUN_EXECUTION == "thread" else None,
        "embedded": settings.RUN_EXECUTION == "thread" and connection.vendor == "sqlite",
    }
