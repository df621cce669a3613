from __future__ import annotations

import os
from typing import Any

from django.core.asgi import get_asgi_application

from pandaweb.localfiles import ensure_local_files

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pandaweb.settings")
# An entry point: the embedded default's keys are made here; the settings only read them.
ensure_local_files()
# Django must be set up before anything imports models (the consumers below do).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from pandaweb.api.mcp_asgi import endpoint as mcp_endpoint  # noqa: E402
from pandaweb.api.mcp_asgi import is_mcp_path  # noqa: E402
from pandaweb.core.origins import ExactOriginValidator  # noqa: E402
from pandaweb.routing import websocket_urlpatterns  # noqa: E402

if settings.RUN_EXECUTION == "thread" and settings.EMBEDDED_WORKER:
    from pandaweb.audit.tasks import audit_checkpoint_task
    from pandaweb.core.dispatch import start_periodic
    from pandaweb.schedules.tasks import schedules_tick_task
    from pandaweb.webhooks.tasks import webhooks_drain_task
    from sessions.engine.driver import warm
    from sessions.tasks import (
        run_files_prune_task,
        runs_reap_task,
        sandboxes_reap_task,
        session_templates_rebake_task,
    )

    # The first run, or a continuation after a restart, does not wait for Node.js to start.
    warm()

    # Embedded default: this process executes runs, so it also reaps the ones that went quiet,
    # re-bakes the session templates that are due and signs audit checkpoints (Celery beat's work
    # in scale-out mode).
    start_periodic(runs_reap_task, every=30.0)
    start_periodic(sandboxes_reap_task, every=float(settings.HOUSEKEEPING_SECONDS))
    start_periodic(session_templates_rebake_task, every=300.0)
    start_periodic(run_files_prune_task, every=3600.0)
    start_periodic(audit_checkpoint_task, every=float(settings.AUDIT_CHECKPOINT_INTERVAL_SECONDS))
    # Webhook retries and schedules: beat's "deliver-webhooks" and "fire-schedules" entries.
    start_periodic(webhooks_drain_task, every=10.0)
    start_periodic(schedules_tick_task, every=15.0)


async def http_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The dashboard, but ``/mcp/`` goes to the MCP server (docs/mcp.md)."""
    if is_mcp_path(scope["path"]):
        await mcp_endpoint(scope, receive, send)
    else:
        await django_asgi_app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": http_app,
        # Scheme, host and port must match one of the dashboard's own origins exactly.
        "websocket": ExactOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns)), settings.PUBLIC_ORIGINS
        ),
    }
)
