"""A fake of Slack's Web API on loopback, and signed callbacks as Slack sends them.

The real Slack cannot be reached from the test machines, so ``WebClient`` is pointed (through
``PANDAWEB_SLACK_API_URL``) at this server, which records every call and answers like Slack.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode

from slack_sdk.signature import SignatureVerifier


@dataclass
class SlackCall:
    method: str
    params: dict[str, Any]
    token: str
    at: float = field(default_factory=time.monotonic)
    wall: float = field(default_factory=time.time)


class FakeSlack:
    """Answers ``/api/<method>`` like Slack: ``chat.postMessage`` gets a channel and a ts."""

    def __init__(self) -> None:
        self.calls: list[SlackCall] = []
        self.lock = threading.Lock()
        self.posted = threading.Condition(self.lock)
        self._ts = 1_700_000_000
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length).decode()
                if self.headers.get("Content-Type", "").startswith("application/json"):
                    params = json.loads(raw or "{}")
                else:
                    params = dict(parse_qsl(raw))
                method = self.path.rsplit("/", 1)[-1]
                token = self.headers.get("Authorization", "").removeprefix("Bearer ")
                answer = fake.answer(method, params, token)
                body = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, method: str, params: dict[str, Any], token: str) -> dict[str, Any]:
        with self.posted:
            self.calls.append(SlackCall(method, params, token))
            self._ts += 1
            self.posted.notify_all()
            if method in ("chat.postMessage", "chat.update"):
                channel = str(params.get("channel", ""))
                if channel.startswith("U"):
                    channel = "D" + channel[1:]  # a direct message opens the app's DM channel
                ts = params.get("ts") or f"{self._ts}.000100"
                return {"ok": True, "channel": channel, "ts": ts}
            if method == "chat.postEphemeral":
                return {"ok": True, "message_ts": f"{self._ts}.000200"}
            if method == "views.open":
                return {"ok": True, "view": {"id": "V1"}}
            return {"ok": True}

    def of(self, method: str) -> list[SlackCall]:
        with self.lock:
            return [c for c in self.calls if c.method == method]

    def wait_for(self, method: str, count: int = 1, timeout: float = 10.0) -> list[SlackCall]:
        with self.posted:
            self.posted.wait_for(
                lambda: sum(1 for c in self.calls if c.method == method) >= count, timeout
            )
        return self.of(method)

    def __enter__(self) -> FakeSlack:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def signed(secret: str, fields: dict[str, str], *, timestamp: int | None = None) -> dict[str, Any]:
    """The body and headers of a callback as Slack signs it (``v0=HMAC(v0:ts:body)``)."""
    body = urlencode(fields)
    ts = str(int(time.time()) if timestamp is None else timestamp)
    signature = SignatureVerifier(secret).generate_signature(timestamp=ts, body=body)
    return {
        "data": body,
        "content_type": "application/x-www-form-urlencoded",
        "headers": {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": signature},
    }


def block_action(
    *, team: str, user: str, action_id: str, value: str, channel: str = "C0PAYMENTS"
) -> dict[str, str]:
    payload = {
        "type": "block_actions",
        "team": {"id": team},
        "user": {"id": user, "team_id": team, "username": "someone", "name": "someone"},
        "channel": {"id": channel},
        "trigger_id": f"trigger-{time.monotonic_ns()}",
        "actions": [{"action_id": action_id, "block_id": "decide", "value": value}],
    }
    return {"payload": json.dumps(payload)}


def view_submission(*, team: str, user: str, metadata: str, reason: str) -> dict[str, str]:
    payload = {
        "type": "view_submission",
        "team": {"id": team},
        "user": {"id": user, "team_id": team},
        "view": {
            "callback_id": "reject_reason",
            "private_metadata": metadata,
            "state": {
                "values": {"reason": {"reason": {"type": "plain_text_input", "value": reason}}}
            },
        },
    }
    return {"payload": json.dumps(payload)}
