from __future__ import annotations

from django.urls import path

from approvals import passkey_views, views

app_name = "approvals"
urlpatterns = [
    path("", views.approval_index, name="index"),
    path("<int:approval_id>/", views.approval_detail, name="detail"),
    path("<int:approval_id>/decide/", views.approval_decide, name="decide"),
    path(
        "<int:approval_id>/passkey/",
        passkey_views.approval_passkey_options,
        name="passkey_options",
    ),
    path("<int:approval_id>/comment/", views.approval_comment, name="comment"),
    path("<int:approval_id>/reassign/", views.approval_reassign, name="reassign"),
    path("questions/<int:question_id>/answer/", views.question_answer, name="question_answer"),
]
