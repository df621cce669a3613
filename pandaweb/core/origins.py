"""Exact websocket origins: scheme, host and port must all match one of the dashboard's own.

Channels' ``AllowedHostsOriginValidator`` compares host names only, so a page served by another
port of the same host (another service, or anything a person runs locally) could open a
websocket with the person's session cookie: SameSite=Lax does not stop a cross-site websocket.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier

DEFAULT_PORTS = {"http": 80, "https": 443}


def normalize_origin(origin: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of an origin, with the scheme's default port filled in; None
    when it is not an http(s) origin (``null``, a file page, garbage)."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        return None
    return scheme, parts.hostname.lower(), port if port is not None else DEFAULT_PORTS[scheme]


class ExactOriginValidator:
    """ASGI middleware: a websocket whose Origin is not exactly one of ``origins`` is refused
    before the consumer runs (no origin header at all is refused too: every browser sends one)."""

    def __init__(self, application: Any, origins: Iterable[str]) -> None:
        self.application = application
        self.allowed: set[tuple[str, str, int]] = set()
        for origin in origins:
            normalized = normalize_origin(origin)
            if normalized is None:
                raise ValueError(f"{origin!r} is not an origin like https://host[:port]")
            self.allowed.add(normalized)

    def allows(self, origin: str | None) -> bool:
        return origin is not None and normalize_origin(origin) in self.allowed

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "websocket":
            raise ValueError(f"ExactOriginValidator is for websockets, not {scope['type']}")
        origin = None
        for name, value in scope.get("headers", []):
            if name == b"origin":
                origin = value.decode("latin1")
                break
        if not self.allows(origin):
            denier = WebsocketDenier()
            return await denier(scope, receive, send)
        return await self.application(scope, receive, send)
