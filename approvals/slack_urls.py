from __future__ import annotations

from django.urls import path

from approvals import slack_views

app_name = "slack"
urlpatterns = [
    path("interactions", slack_views.slack_interactions, name="interactions"),
    path("commands", slack_views.slack_commands, name="commands"),
    path("card-image/<str:token>.png", slack_views.slack_card_image, name="card_image"),
    path("preview/<int:approval_id>/", slack_views.slack_card_preview, name="preview"),
]
