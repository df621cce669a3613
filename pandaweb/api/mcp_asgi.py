"""The ``/mcp/`` endpoint: streamable HTTP for the MCP server, inside the dashboard's ASGI app.

daphne sends no ASGI lifespan events, so the SDK's session manager (and the task group its
sessions live in) is started on the first request, in the server's own event loop, and lives as
long as the process. Sessions are stateful: the client's name from ``initialize`` names every
audit event of the session, and a session answers only to the token that opened it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import OperationalError
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from pandaweb.api.mcp_server import build_server
from pandaweb.api.services import BEARER_NEEDED, token_authenticate, token_refusal
from pandaweb.core.database import BUSY, RETRY_AFTER_SECONDS

PATH = "/mcp"


def is_mcp_path(path: str) -> bool:
    return path == PATH or path.startswith(PATH + "/")


def _bearer(headers: Any) -> str | None:
    value = headers.get("authorization") if headers is not None else None
    if not value or not value.lower().startswith("bearer "):
        return None
    return str(value[7:].strip())


def _raw_token(ctx: ServerRequestContext[Any, Any]) -> str | None:
    request = ctx.request
    return _bearer(getattr(request, "headers", None))


def _session(ctx: ServerRequestContext[Any, Any]) -> str:
    request = ctx.request
    headers = getattr(request, "headers", None)
    return str(headers.get("mcp-session-id", "")) if headers is not None else ""


async def _answer(send: Any, status: int, message: str, headers: list[tuple[bytes, bytes]]) -> None:
    body = json.dumps({"error": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


class McpEndpoint:
    def __init__(self) -> None:
        self._manager: StreamableHTTPSessionManager | None = None
        self._started: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._task: asyncio.Task[None] | None = None

    async def _ensure_started(self) -> StreamableHTTPSessionManager:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._manager is None:
                base = settings.PUBLIC_ORIGINS[0] if settings.PUBLIC_ORIGINS else ""
                server = build_server(_raw_token, base_url=base, session_of=_session)
                manager = StreamableHTTPSessionManager(app=server)
                started = asyncio.Event()

                async def serve() -> None:
                    async with manager.run():
                        started.set()
                        await asyncio.Event().wait()  # until the process ends

                self._task = asyncio.get_running_loop().create_task(serve())
                await started.wait()
                self._manager = manager
        return self._manager

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        raw = _bearer(headers)
        refusal = BEARER_NEEDED
        try:
            token = await database_sync_to_async(token_authenticate)(raw) if raw else None
            if token is None and raw:
                refusal = await database_sync_to_async(token_refusal)(raw)
        except OperationalError:
            # As the dashboard's own requests (pandaweb/core/database.py): no free connection,
            # or none the server would give, is a 503 to retry, not a 500.
            await _answer(send, 503, BUSY, [(b"retry-after", str(RETRY_AFTER_SECONDS).encode())])
            return
        if token is None:
            await _answer(send, 401, refusal, [(b"www-authenticate", b'Bearer realm="pandaweb"')])
            return
        # The SDK binds a session to the credential that opened it: an API token, or an OAuth
        # client, whose next access token (they last minutes) goes on with the same session.
        principal = AccessToken(
            token=f"pandaweb-{token.principal}",
            client_id=f"pandaweb-{token.principal}",
            scopes=sorted(s.value for s in token.effective),
        )
        scope = {**scope, "user": AuthenticatedUser(principal)}
        manager = await self._ensure_started()
        await manager.handle_request(scope, receive, send)


endpoint = McpEndpoint()
