from __future__ import annotations

from django.apps import AppConfig


class DemoPortalConfig(AppConfig):
    name = "pandaweb.demo_portal"
    label = "demo_portal"
    verbose_name = "Demo portal"
