"""RFC 9457 problem details: every error of the API is one of these.

``errors`` carries field-level messages as ``{"field": "inputs.amount", "message": "..."}``, the
field a dotted path into the request (body fields by name, query parameters and headers by theirs);
problems of a workflow file also say ``where`` in people's words and the file's ``line``.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse

CONTENT_TYPE = "application/problem+json"
TYPE_BASE = "https://pandaweb.invalid/problems/"  # a name, never fetched; see docs/api.md

TITLES = {
    400: "Bad request",
    401: "Not authenticated",
    403: "Forbidden",
    404: "Not found",
    409: "Conflict",
    422: "Invalid request",
    429: "Too many requests",
    500: "Server error",
    503: "Service unavailable",
}


class Problem(Exception):
    """Raise anywhere in an endpoint to answer with a problem document."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        type: str = "",
        errors: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.type = type or {
            401: "unauthenticated",
            403: "forbidden",
            404: "not-found",
            409: "conflict",
            422: "validation",
            429: "rate-limited",
        }.get(status, "error")
        self.errors = errors or []
        self.headers = headers or {}
        self.extra = extra


def field_errors(errors: dict[str, list[str]], *, under: str = "") -> list[dict[str, str]]:
    """A service's ``{"name": [messages]}`` as problem entries, ``__all__`` as the parent."""
    entries: list[dict[str, str]] = []
    for name, messages in errors.items():
        field = under if name == "__all__" else f"{under}.{name}" if under else name
        entries.extend({"field": field, "message": message} for message in messages)
    return entries


def render(request: HttpRequest, problem: Problem) -> HttpResponse:
    document: dict[str, Any] = {
        "type": TYPE_BASE + problem.type,
        "title": TITLES.get(problem.status, "Error"),
        "status": problem.status,
        "detail": problem.detail,
        "instance": request.path,
    }
    if problem.errors:
        document["errors"] = problem.errors
    document.update(problem.extra)
    response = HttpResponse(json.dumps(document), status=problem.status, content_type=CONTENT_TYPE)
    for name, value in problem.headers.items():
        response[name] = value
    return response


def from_validation(errors: list[dict[str, Any]]) -> list[dict[str, str]]:
    """django-ninja / pydantic errors (``loc`` like ["body", "payload", "inputs", "amount"]) as
    field paths; the location and the parameter's Python name are dropped."""
    entries: list[dict[str, str]] = []
    for error in errors:
        loc = [str(part) for part in error.get("loc", [])]
        if loc and loc[0] == "body":
            loc = loc[2:] if len(loc) > 1 else []
        elif loc and loc[0] in {"query", "path", "header", "cookie"}:
            loc = loc[1:]
        entries.append({"field": ".".join(loc), "message": str(error.get("msg", "is invalid"))})
    return entries
