from __future__ import annotations

from django.urls import path

from pandaweb.reviewers import views

urlpatterns = [
    path("slack/code/", views.slack_code, name="profile_slack_code"),
    path("slack/unlink/", views.slack_unlink, name="profile_slack_unlink"),
    path("passkeys/options/", views.passkey_options, name="profile_passkey_options"),
    path("passkeys/", views.passkey_register, name="profile_passkey_register"),
    path("passkeys/<int:passkey_id>/delete/", views.passkey_delete, name="profile_passkey_delete"),
    path("notifications/", views.notifications, name="profile_notifications"),
    path("push/", views.push_subscribe, name="profile_push"),
]
