from __future__ import annotations

import os
from typing import Any

import anyio
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from mcp.server.stdio import stdio_server

from pandaweb.api.mcp_server import build_server, new_session_id
from pandaweb.api.services import token_authenticate


class Command(BaseCommand):
    help = (
        "Serve the MCP server (published workflows as tools) on stdin/stdout for a local AI "
        "client. The token comes from --token or PANDAWEB_TOKEN; it is checked again on every "
        "request, so revoking it stops the client."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--token", default="", help="A pw_… API token (else PANDAWEB_TOKEN).")

    def handle(self, *args: Any, **options: Any) -> None:
        raw = options["token"] or os.environ.get("PANDAWEB_TOKEN", "")
        if token_authenticate(raw) is None:
            raise CommandError("the token is unknown, revoked or expired")
        session = new_session_id()
        server = build_server(
            lambda ctx: raw,
            base_url=settings.PUBLIC_ORIGINS[0] if settings.PUBLIC_ORIGINS else "",
            session_of=lambda ctx: session,
        )

        async def serve() -> None:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())

        anyio.run(serve)
