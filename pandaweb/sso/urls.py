from __future__ import annotations

from django.urls import path

from pandaweb.sso import views

urlpatterns = [
    path("start/", views.sso_start, name="sso_start"),
    path("callback/", views.sso_callback, name="sso_callback"),
]
