from __future__ import annotations

from approvals.routing import websocket_urlpatterns as approvals_routes
from sessions.routing import websocket_urlpatterns as sessions_routes

websocket_urlpatterns = [*approvals_routes, *sessions_routes]
