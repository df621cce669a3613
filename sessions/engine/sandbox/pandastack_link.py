"""The worker's link to a PandaStack sandbox: its CDP relay and its egress tunnels (no Django
imports).

``Relay`` is what a sandbox's ``cdp_url`` names, on the worker's loopback: it signs each CDP
request with the API key and the gate's secret, sends it through the platform's authenticated
port proxy (``Upstream``), and rewrites the WebSocket URLs Chromium reports to itself.
``Tunnels`` keeps a few WebSocket-upgraded connections open into the gate
(``sessions.engine.sandbox.pandastack_gate``) and connects each one the gate takes to the run's
egress proxy. Both live in the process that created the sandbox (``keep_link``), which is why
its browser loses its way out when that process dies.
"""

from __future__ import annotations

import base64
import contextlib
import hmac
import json
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urljoin, urlsplit

from sessions.engine.sandbox import cdp_gate

logger = logging.getLogger(__name__)

GATE_HEADER = "X-Pandaweb-Gate"
TUNNEL_PATH = "/.pandaweb/tunnel"

# One byte each way before a tunnel carries a browser connection: the gate says "take this one"
# and waits for the worker's "connected to the egress proxy", so a dead tunnel is noticed before
# the browser's bytes go into it. Idle tunnels get a keep-alive byte from the gate.
_TAKE, _TAKEN, _KEEPALIVE = b"\x01", b"\x02", b"\x00"

_HOP_HEADERS = frozenset(
    {
        "host",
        "authorization",
        GATE_HEADER.lower(),
        "proxy-authorization",
        "proxy-connection",
        "content-length",
        "transfer-encoding",
    }
)


def _gate_secret(api_key: str, sandbox_id: str) -> str:
    """The gate's secret for one sandbox, derived from the API key: any process that can manage
    the sandbox can recompute it, and it is stored nowhere (sandbox records reach the audit log).
    It grants no more than the key itself does."""
    return hmac.new(api_key.encode(), f"pandaweb-gate:{sandbox_id}".encode(), "sha256").hexdigest()


def _relay_secret(api_key: str, sandbox_id: str) -> str:
    """The secret a client of the worker's relay must put first in its request paths: derived
    like the gate's, under its own label, so a worker that adopts the sandbox serves the same
    ``cdp_url``."""
    return hmac.new(api_key.encode(), f"pandaweb-relay:{sandbox_id}".encode(), "sha256").hexdigest()


def _api_endpoint(api_url: str, path: str) -> str:
    """``path`` under the API, as the SDK's ``Client._url`` builds it (``/v1`` added unless the
    configured URL already ends with it)."""
    base = api_url.rstrip("/")
    clean = path.lstrip("/")
    if not clean.startswith("v1/") and not base.endswith("/v1"):
        clean = f"v1/{clean}"
    return urljoin(f"{base}/", clean)


def _read_head(sock: socket.socket) -> tuple[bytes, bytes] | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk or len(data) > 65536:
            return None
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    return head, rest


def _header_map(head: bytes) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        found[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return found


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways until both sides are done, then close both."""

    def copy(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    other = threading.Thread(target=copy, args=(b, a), daemon=True)
    other.start()
    copy(a, b)
    other.join()
    a.close()
    b.close()


def _rewrite_ws_urls(data: Any, authority: str) -> Any:
    """Point the WebSocket URLs in a DevTools JSON answer at the relay instead of the guest."""
    if isinstance(data, dict):
        return {key: _rewrite_ws_urls(value, authority) for key, value in data.items()}
    if isinstance(data, list):
        return [_rewrite_ws_urls(value, authority) for value in data]
    if isinstance(data, str) and data.startswith(("ws://", "wss://")):
        parts = urlsplit(data)
        query = f"?{parts.query}" if parts.query else ""
        return f"ws://{authority}{parts.path}{query}"
    return data


class Upstream:
    """How the worker reaches the gate: the platform's authenticated port proxy."""

    def __init__(self, client: Any, sandbox_id: str, gate_port: int) -> None:
        self.client = client
        self.base = _api_endpoint(client.api_url, f"/sandboxes/{sandbox_id}/proxy/{gate_port}")
        self.sandbox_id = sandbox_id
        self.secret = _gate_secret(client.api_key, sandbox_id)
        parts = urlsplit(self.base)
        self.tls = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self.tls else 80)
        self.netloc = parts.netloc
        self.path = parts.path.rstrip("/")

    def request(self, method: str, target: str, body: bytes | None, timeout: float) -> Any:
        """One plain HTTP request to the gate. A session of its own per request: the relay
        serves several threads, and the SDK client's session is not made for that."""
        import requests  # the SDK's own HTTP library

        return requests.request(
            method,
            self.base + target,
            data=body,
            headers={
                "Authorization": f"Bearer {self.client.api_key}",
                GATE_HEADER: self.secret,
                "User-Agent": "pandaweb-pandastack-relay",
            },
            timeout=timeout,
            allow_redirects=False,
        )

    def upgrade(
        self, target: str, headers: Sequence[tuple[str, str]], rest: bytes = b""
    ) -> socket.socket:
        """Open a raw connection and send a WebSocket upgrade request for ``target``; the
        response is left for the caller to read."""
        sock = socket.create_connection((self.host, self.port), timeout=15)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if self.tls:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
            lines = [
                f"GET {self.path}{target} HTTP/1.1",
                f"Host: {self.netloc}",
                f"Authorization: Bearer {self.client.api_key}",
                f"{GATE_HEADER}: {self.secret}",
                *(f"{name}: {value}" for name, value in headers),
            ]
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + rest)
        except BaseException:
            sock.close()
            raise
        return sock


class _Relay:
    """The loopback endpoint ``cdp_url`` names: CDP requests go to the gate, signed.

    It is on host loopback, where every local process can connect, and it signs what it passes
    on: so it passes on only requests whose path starts with the relay's own secret (as the
    local backend's CDP gate does), which ``url`` carries."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.secret = _relay_secret(upstream.client.api_key, upstream.sandbox_id)
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self.port = self._server.getsockname()[1]
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._accept, name=f"pandastack-relay-{self.port}", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{self.secret}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(30)
            read = _read_head(conn)
            if read is None:
                conn.close()
                return
            head, rest = read
            method, gated, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            inner = cdp_gate.strip_secret(gated.encode("latin-1"), self.secret.encode())
            if inner is None:
                conn.sendall(cdp_gate.FORBIDDEN)
                conn.close()
                return
            target = inner.decode("latin-1")
            headers = _header_map(head)
            if headers.get("upgrade", "").lower() == "websocket":
                self._upgrade(conn, target, head, rest)
            else:
                self._plain(conn, method, target, headers, rest)
        except Exception:
            logger.debug("pandastack relay: request failed", exc_info=True)
            conn.close()

    def _upgrade(self, conn: socket.socket, target: str, head: bytes, rest: bytes) -> None:
        passed = []
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() not in _HOP_HEADERS:
                passed.append((name.strip(), value.strip()))
        try:
            upstream = self.upstream.upgrade(target, passed, rest)
        except OSError:
            conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            conn.close()
            return
        conn.settimeout(None)
        upstream.settimeout(None)
        _pipe(conn, upstream)

    def _plain(
        self, conn: socket.socket, method: str, target: str, headers: dict[str, str], rest: bytes
    ) -> None:
        length = int(headers.get("content-length", "0") or 0)
        while len(rest) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            rest += chunk
        try:
            response = self.upstream.request(method, target, rest[:length] or None, timeout=30)
            status, reason, body = response.status_code, response.reason or "", response.content
            kind = response.headers.get("content-type", "application/octet-stream")
        except Exception as exc:  # the API is unreachable: answer like a gateway
            status, reason, kind = 502, "Bad Gateway", "text/plain"
            body = f"the PandaStack API did not answer: {exc}".encode()
        if status == 200 and target.startswith("/json"):
            with contextlib.suppress(ValueError):
                data = _rewrite_ws_urls(json.loads(body), f"127.0.0.1:{self.port}/{self.secret}")
                body = json.dumps(data).encode()
        conn.sendall(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("latin-1")
            + body
        )
        conn.close()


class _Tunnels:
    """Keeps ``size`` idle tunnels open into the gate; each one the gate takes is connected to
    the run's egress proxy. Stops by itself when the platform says the sandbox is gone."""

    def __init__(self, upstream: Upstream, proxy_url: str, size: int) -> None:
        parts = urlsplit(proxy_url)
        self.upstream = upstream
        self.proxy = (parts.hostname or "127.0.0.1", int(parts.port or 0))
        self.size = size
        self.connected = threading.Event()
        self.gone = threading.Event()
        self._stopped = threading.Event()
        self._idle: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._keep_one, name=f"pandastack-tunnel-{i}", daemon=True)
            for i in range(size)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            idle, self._idle = self._idle, set()
        for sock in idle:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _keep_one(self) -> None:
        delay = 0.2
        failing_since: float | None = None
        while not self._stopped.is_set():
            try:
                sock, early = self._open()
            except _SandboxGone:
                self._give_up()
                return
            except (OSError, _Refused) as exc:
                now = time.monotonic()
                failing_since = failing_since or now
                if self.connected.is_set() and now - failing_since > self.GIVE_UP_SECONDS:
                    # The gate is gone (its deadline passed, or Chromium died). Every attempt is
                    # an API request that counts as activity and would keep the VM from being
                    # reaped, so stop trying.
                    logger.info("pandastack tunnels: the gate stopped answering (%s)", exc)
                    self._give_up()
                    return
                self._stopped.wait(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay, failing_since = 0.2, None
            self.connected.set()
            self._wait_and_serve(sock, early)

    GIVE_UP_SECONDS = 60.0

    def _give_up(self) -> None:
        self.gone.set()
        self.stop()

    def _open(self) -> tuple[socket.socket, bytes]:
        """An upgraded connection to the gate, and any bytes the gate sent right after."""
        key = base64.b64encode(os.urandom(16)).decode()
        sock = self.upstream.upgrade(
            TUNNEL_PATH,
            [
                ("Upgrade", "websocket"),
                ("Connection", "Upgrade"),
                ("Sec-WebSocket-Key", key),
                ("Sec-WebSocket-Version", "13"),
            ],
        )
        try:
            read = _read_head(sock)
            status = read[0].split(b" ", 2)[1] if read and b" " in read[0] else b""
            if status == b"404":
                raise _SandboxGone
            if status != b"101" or read is None:
                raise _Refused(f"the gate answered {status.decode('latin-1') or 'nothing'}")
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        return sock, read[1]

    def _wait_and_serve(self, sock: socket.socket, early: bytes) -> None:
        with self._lock:
            if self._stopped.is_set():
                sock.close()
                return
            self._idle.add(sock)
        pending = early
        try:
            while not (pending := pending.lstrip(_KEEPALIVE)):
                pending = sock.recv(1)
                if not pending:
                    break
        except OSError:
            pending = b""
        with self._lock:
            self._idle.discard(sock)
        # The gate sends nothing after "take" until it hears "taken".
        if pending != _TAKE or self._stopped.is_set():
            sock.close()
            return
        try:
            out = socket.create_connection(self.proxy, timeout=10)
            out.settimeout(None)
            sock.sendall(_TAKEN)
        except OSError:
            # The gate hears no answer and tries the next tunnel; the browser sees an error
            # only if the egress proxy itself is down.
            sock.close()
            return
        threading.Thread(target=_pipe, args=(sock, out), daemon=True).start()


class _SandboxGone(Exception):
    pass


class _Refused(Exception):
    pass


class Link:
    """The in-process half of one sandbox: its relay and its tunnels."""

    def __init__(self, upstream: Upstream, proxy_url: str, tunnels: int) -> None:
        self.relay = _Relay(upstream)
        self.tunnels = _Tunnels(upstream, proxy_url, tunnels)

    def start(self) -> None:
        self.relay.start()
        self.tunnels.start()

    def stop(self) -> None:
        self.tunnels.stop()
        self.relay.stop()


# The links this process holds, by run key: destroy() and snapshot() may be called on another
# backend instance than create() (each service call gets its own).
_LINKS: dict[str, Link] = {}
_LINKS_LOCK = threading.Lock()


def keep_link(run_key: str, link: Link) -> None:
    with _LINKS_LOCK:
        _LINKS[run_key] = link


def drop_link(run_key: str) -> None:
    """Stop this process's link to the sandbox of ``run_key``, if it holds one."""
    with _LINKS_LOCK:
        link = _LINKS.pop(run_key, None)
    if link is not None:
        link.stop()
