from __future__ import annotations

from django.urls import path

from pandaweb.teams import views

app_name = "teams"
urlpatterns = [
    path("", views.team_index, name="index"),
    path("<slug:slug>/", views.team_detail, name="detail"),
    path("<slug:slug>/members/", views.member_add, name="member_add"),
    path(
        "<slug:slug>/members/<int:membership_id>/remove/",
        views.member_remove,
        name="member_remove",
    ),
]
