from __future__ import annotations

from django.urls import path

from workflows import views

app_name = "workflows"
urlpatterns = [path("", views.workflow_index, name="index")]
