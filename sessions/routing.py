from __future__ import annotations

from django.urls import path

from sessions.consumers import (
    HomeCountsConsumer,
    LiveConsumer,
    RunConsumer,
    RunListConsumer,
    RunQueueConsumer,
)

websocket_urlpatterns = [
    path("ws/home/", HomeCountsConsumer.as_asgi()),
    path("ws/runs/", RunListConsumer.as_asgi()),
    path("ws/runs/<int:run_id>/", RunConsumer.as_asgi()),
    path("ws/runs/<int:run_id>/queue/", RunQueueConsumer.as_asgi()),
    path("ws/runs/<int:run_id>/live/", LiveConsumer.as_asgi()),
]
