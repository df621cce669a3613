"""A request the database cannot serve now is told so: 503 and when to retry, never a 500.

PostgreSQL connections come from a bounded pool per process (``PANDAWEB_DB_POOL_MAX``); when
every one is busy for ``PANDAWEB_DB_POOL_TIMEOUT`` seconds, or the server refuses a new one, the
request is answered before any of it runs, so nothing is half done.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import OperationalError, connection
from django.http import HttpRequest, HttpResponse

from pandaweb.api import problems

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 5
BUSY = "no database connection is free right now; try again in a few seconds"


class DatabaseAvailableMiddleware:
    """Takes the request's connection first, where a failure can still be answered cleanly.

    A request keeps the connection it took until it ends, so taking it here instead of at the
    first query costs no extra connection.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            connection.ensure_connection()
        except OperationalError as exc:
            logger.warning("answered %s with 503: %s", request.path, exc)
            return unavailable(request)
        return self.get_response(request)


def unavailable(request: HttpRequest) -> HttpResponse:
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    if request.path.startswith("/api/"):
        problem = problems.Problem(503, BUSY, type="unavailable", headers=headers)
        return problems.render(request, problem)
    return HttpResponse(
        f"The dashboard is busy: {BUSY}.\n",
        status=503,
        content_type="text/plain; charset=utf-8",
        headers=headers,
    )
