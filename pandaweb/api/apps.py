from __future__ import annotations

from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "pandaweb.api"
    label = "api"
    verbose_name = "HTTP API"
