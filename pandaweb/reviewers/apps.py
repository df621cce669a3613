from __future__ import annotations

from django.apps import AppConfig


class ReviewersConfig(AppConfig):
    name = "pandaweb.reviewers"
    label = "reviewers"
    verbose_name = "Reviewers: linked identities, passkeys, notifications"
