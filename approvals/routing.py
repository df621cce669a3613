from __future__ import annotations

from django.urls import path

from approvals.consumers import NavigationConsumer

websocket_urlpatterns = [path("ws/nav/", NavigationConsumer.as_asgi())]
