from __future__ import annotations

from django.urls import path

from sessions import views

app_name = "runs"
urlpatterns = [path("", views.run_index, name="index")]
