from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from standardwebhooks import Webhook

from tests.sessions.conftest import acme_credential, demo_workflow, no_background_runs, operator

__all__ = ["acme_credential", "demo_workflow", "no_background_runs", "operator"]


@dataclass
class Receiver:
    """A webhook receiver on loopback that checks every signature with standardwebhooks."""

    url: str
    secret: str = ""
    answer: int = 204
    # Set to hold answers back (a slow receiver); released at teardown.
    hold: threading.Event | None = None
    received: list[dict[str, Any]] = field(default_factory=list)

    def verify(self, body: bytes, headers: dict[str, str]) -> Any:
        return Webhook(self.secret).verify(body, headers)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            headers = dict(self.headers.items())
            try:
                payload = state.verify(body, headers)
                verified = True
            except Exception:
                payload, verified = None, False
            state.received.append({"headers": headers, "payload": payload, "verified": verified})
            if state.hold is not None:
                state.hold.wait(10)
            self.send_response(state.answer)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_port}/hooks"
    yield state
    if state.hold is not None:
        state.hold.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def closed_port_url() -> str:
    """A loopback address where nothing listens: connecting is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/hooks"
