from __future__ import annotations

from django.contrib.auth.models import User
from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails


class HtmxHttpRequest(HttpRequest):
    """The request type of views that look at ``request.htmx`` (set by django-htmx)."""

    htmx: HtmxDetails


class AuthenticatedRequest(HtmxHttpRequest):
    """A request of a signed-in person: ``LoginRequiredMiddleware`` lets no other reach a view."""

    user: User
