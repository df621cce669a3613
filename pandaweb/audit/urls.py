from __future__ import annotations

from django.urls import path

from pandaweb.audit import views

app_name = "audit"
urlpatterns = [path("", views.audit_index, name="index")]
