from __future__ import annotations

from django.urls import path

from approvals import views

app_name = "approvals"
urlpatterns = [path("", views.approval_index, name="index")]
