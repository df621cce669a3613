from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, PermissionsMixin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseBase

from pandaweb.core.roles import Capability


def user_can(user: AbstractBaseUser | AnonymousUser, capability: Capability) -> bool:
    if not (user.is_authenticated and user.is_active):
        return False
    return isinstance(user, PermissionsMixin) and user.has_perm(capability.perm)


def capability_required(
    capability: Capability,
) -> Callable[[Callable[..., HttpResponseBase]], Callable[..., HttpResponseBase]]:
    """Refuse a signed-in user without ``capability`` with 403.

    Anonymous users never get here: ``LoginRequiredMiddleware`` sends them to the login page.
    """

    def decorator(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not user_can(request.user, capability):
                raise PermissionDenied(f"This page needs the capability '{capability.value}'.")
            return view(request, *args, **kwargs)

        return wrapped

    return decorator
