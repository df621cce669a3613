from __future__ import annotations

from django.urls import path

from sessions.consumers import RunConsumer, RunListConsumer

websocket_urlpatterns = [
    path("ws/runs/", RunListConsumer.as_asgi()),
    path("ws/runs/<int:run_id>/", RunConsumer.as_asgi()),
]
