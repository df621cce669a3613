from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pandaweb.settings")
# Django must be set up before anything imports models (the consumers below do).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from pandaweb.routing import websocket_urlpatterns  # noqa: E402

if settings.RUN_EXECUTION == "thread":
    from pandaweb.core.dispatch import start_periodic
    from sessions.tasks import runs_reap_task, sandboxes_reap_task, session_templates_rebake_task

    # Embedded default: this process executes runs, so it also reaps the ones that went quiet
    # and re-bakes the session templates that are due (Celery beat's work in scale-out mode).
    start_periodic(runs_reap_task, every=30.0)
    start_periodic(sandboxes_reap_task, every=60.0)
    start_periodic(session_templates_rebake_task, every=300.0)

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
