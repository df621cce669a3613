from __future__ import annotations

from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "pandaweb.webhooks"
    label = "webhooks"
    verbose_name = "Webhooks"
