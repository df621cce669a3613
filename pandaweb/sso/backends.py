"""Password sign-in, refused when local passwords are switched off (but for break-glass)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import User
from django.http import HttpRequest


def password_sign_in_allowed(username: str | None) -> bool:
    """Whether ``username`` may sign in with a password here."""
    if settings.LOCAL_PASSWORDS:
        return True
    return bool(settings.BREAK_GLASS_ADMIN) and username == settings.BREAK_GLASS_ADMIN


class LocalPasswordBackend(ModelBackend):
    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> User | None:
        if not password_sign_in_allowed(username):
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)
