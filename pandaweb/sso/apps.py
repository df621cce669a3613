from __future__ import annotations

from django.apps import AppConfig


class SsoConfig(AppConfig):
    name = "pandaweb.sso"
    label = "sso"
    verbose_name = "Single sign-on"
