from __future__ import annotations

from django.urls import path

from pandaweb.core import views

urlpatterns = [
    path("", views.home, name="home"),
    path("system/", views.system, name="system"),
    path("system/ping/", views.system_ping, name="system_ping"),
]
