"""The web request behind the audit events written while it is handled.

Services do not take the request as an argument; the middleware below puts it in a context
variable so that ``audit_record`` can stamp every event with the request id and client address.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from contextvars import ContextVar

from django.http import HttpRequest, HttpResponse

current_request: ContextVar[HttpRequest | None] = ContextVar("current_request", default=None)

_ACCEPTABLE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,100}$")


class AuditRequestMiddleware:
    """Give each request an id (a proxy's ``X-Request-ID`` when it is sane) and expose it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        offered = request.META.get("HTTP_X_REQUEST_ID", "")
        request_id = offered if _ACCEPTABLE_ID.match(offered) else uuid.uuid4().hex
        request.request_id = request_id  # type: ignore[attr-defined]
        token = current_request.set(request)
        try:
            response = self.get_response(request)
        finally:
            current_request.reset(token)
        response["X-Request-ID"] = request_id
        return response
