from __future__ import annotations

from django.urls import path

from approvals import views

app_name = "approvals"
urlpatterns = [
    path("", views.approval_index, name="index"),
    path("<int:approval_id>/", views.approval_detail, name="detail"),
    path("<int:approval_id>/decide/", views.approval_decide, name="decide"),
]
