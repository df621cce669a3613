"""The ``pandastack`` backend: the run's Chromium inside a remote PandaStack Firecracker microVM.

Built on the ``pandastack`` Python SDK (0.10.x), configured by the ``EngineConfig`` handed in
(``pandastack_api``, default ``https://api.pandastack.ai``, and ``pandastack_api_key``, which
settings read from ``PANDASTACK_API`` and ``PANDASTACK_API_KEY``). The SDK can create, exec
into, write files into, snapshot and kill a sandbox; it offers no egress rules, no tunnel and no
way to reach a guest port privately. Three pieces fill the gap:

``gate`` (a standard-library Python program written into the guest, ``_GATE_SOURCE``)
    starts Chromium with its DevTools port on the guest's loopback, and listens on
    ``gate_port``, which the platform's *authenticated* port proxy
    (``{api}/v1/sandboxes/{id}/proxy/{port}/...``, the ``proxy_url`` that ``GET /ports``
    reports) reaches. Every request must carry a per-sandbox secret, so the platform's public
    preview URLs (``https://{port}-{id}.{suffix}``, no authentication) get a 403. It also takes
    the worker's egress tunnels (below) and kills Chromium at the deadline.
relay (in the worker, on 127.0.0.1)
    what ``cdp_url`` points at. It adds the API key and the gate secret to each CDP request and
    rewrites the WebSocket URLs Chromium reports (they name the guest's own address) to itself,
    so ``connect_over_cdp(cdp_url)`` works unchanged. The API key never enters the guest: the
    platform's proxy strips ``Authorization`` before forwarding.
tunnels (in the worker)
    the run's egress proxy listens on the worker's loopback, which a remote guest cannot reach.
    The worker keeps a few WebSocket-upgraded connections open *into* the gate; when Chromium
    opens a proxy connection to the gate's loopback port, the gate hands it to one of them and
    the worker connects it to ``spec.proxy_url``. Chromium is given the same routing flags as in
    the other backends (``sessions.engine.chromium.chromium_proxy_args``), aimed at the gate, so
    every request is still judged and recorded by the run's ``EgressProxy``.

What this backend cannot do, and says so in ``details["isolation_warning"]``: the microVM has
its own network, and the PandaStack API has no control over it. Chromium is held to the proxy by
its flags, as in a local sandbox without namespaces, not by the VM's network; a browser context
opened over CDP with a proxy setting of its own (``direct://``) would reach the internet from
PandaStack's network. Downloads do not work: Chromium writes them inside the guest, where
Playwright on the worker cannot read them (no ``details["artifacts_dir"]`` is offered).

Lifetime: ``ttl_seconds`` on PandaStack is an *idle* TTL (the agent's reaper deletes a sandbox
that has had no API request for that long), kept server side, so the remote sandbox dies by
itself even if the worker dies. The run's deadline itself is enforced inside the guest by the
gate, which kills Chromium when it passes (``extend`` moves it). The gate counts time on the
guest's monotonic clock from the remaining seconds the worker writes, so a VM clock that is off
(a restored snapshot's often is) does not move the deadline.

The relay and the tunnels live in the process that called ``create``, like the run's egress
proxy itself: if that process dies, the browser loses its only way out and CDP goes with it.
``destroy``, ``alive``, ``extend`` and ``snapshot`` only need the API and work from any process
with the same ``PANDASTACK_*`` settings.
"""

from __future__ import annotations

import base64
import contextlib
import hmac
import json
import logging
import math
import os
import secrets
import shlex
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

from sessions.engine.chromium import HEADLESS_ARGS, chromium_proxy_args
from sessions.engine.config import EngineConfig
from sessions.engine.sandbox import cdp_gate
from sessions.engine.sandbox.base import Sandbox, SandboxError, SandboxSpec
from sessions.engine.sandbox.workdirs import json_version

__all__ = ["PandaStackBackend"]

logger = logging.getLogger(__name__)

GATE_PORT = 8765
GUEST_PROXY_PORT = 3128
GUEST_DIR = "/var/tmp/pandaweb"  # noqa: S108 - a path in the guest, created 0700 by us
GUEST_CHROMIUM = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
GATE_HEADER = "X-Pandaweb-Gate"
TUNNEL_PATH = "/.pandaweb/tunnel"

# One byte each way before a tunnel carries a browser connection: the gate says "take this one"
# and waits for the worker's "connected to the egress proxy", so a dead tunnel is noticed before
# the browser's bytes go into it. Idle tunnels get a keep-alive byte from the gate.
_TAKE, _TAKEN, _KEEPALIVE = b"\x01", b"\x02", b"\x00"

_ISOLATION_WARNING = (
    "PandaStack gives no control over the microVM's network: the VM can reach the internet "
    "directly. The browser's traffic reaches the run's egress proxy (through a tunnel to this "
    "worker) because of its proxy flags only, as in a local sandbox without namespaces; a "
    "browser context opened with a proxy setting of its own would bypass it."
)

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


# ---------------------------------------------------------------------------------------------
# The program that runs inside the guest. Standard library only, and Python 3.8-compatible:
# nothing is known about the template's Python beyond ``python3``.

_GATE_SOURCE = r'''
"""pandaweb gate (written by the pandaweb worker; see sessions/engine/sandbox/pandastack.py)."""
import base64, hashlib, hmac, json, os, queue, shutil, signal, socket, subprocess, sys
import threading, time

CFG = json.load(open(sys.argv[1]))
DIR = CFG["dir"]
SECRET = CFG["secret"].encode()
TUNNEL = CFG["tunnel_path"].encode()
IDLE = queue.Queue()
WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def log(*parts):
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


def read_head(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk or len(data) > 65536:
            return None, b""
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    return head, rest


def header_map(head):
    found = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        found[name.strip().lower()] = value.strip()
    return found


def read_response(sock):
    """One response from Chromium's DevTools server, which always sends Content-Length."""
    head, body = read_head(sock)
    if head is None:
        return None, b""
    length = int(header_map(head).get(b"content-length", b"0") or 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head, body


def closing(head, body):
    hop = (b"connection:", b"keep-alive:")
    lines = [l for l in head.split(b"\r\n") if not l.lower().startswith(hop)]
    return b"\r\n".join(lines + [b"Connection: close"]) + b"\r\n\r\n" + body


def refuse(conn, status):
    try:
        conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    finally:
        conn.close()


def pipe(a, b):
    def copy(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
    other = threading.Thread(target=copy, args=(b, a), daemon=True)
    other.start()
    copy(a, b)
    other.join()
    a.close()
    b.close()


def devtools_port():
    try:
        with open(os.path.join(CFG["profile"], "DevToolsActivePort")) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def answers(port):
    if not port:
        return False
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"GET /json/version HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return s.recv(12).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def read_pid(name):
    try:
        with open(os.path.join(DIR, name)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 0


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read()
    except OSError:
        return b""


def stop_previous_gate():
    # A restored snapshot may hold an older gate (with another sandbox's secret): end it first.
    pid = read_pid("gate.pid")
    if pid and pid != os.getpid() and b"gate.py" in cmdline(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        for _ in range(50):
            if not pid_alive(pid):
                break
            time.sleep(0.1)
    with open(os.path.join(DIR, "gate.pid"), "w") as f:
        f.write(str(os.getpid()))


def start_or_adopt():
    pid = read_pid("chromium.pid")
    if pid and pid_alive(pid) and answers(devtools_port()):
        log("adopting the running Chromium", pid)
        return pid, None
    if CFG.get("adopt"):
        # A restored snapshot whose browser is gone: a fresh one would silently lack what the
        # snapshot was taken for (a logged-in session).
        log("the restored snapshot has no running Chromium to adopt")
        sys.exit(4)
    chromium = None
    for name in CFG["chromium"]:
        chromium = shutil.which(name)
        if chromium:
            break
    if not chromium:
        log("no Chromium in this guest (looked for %s)" % ", ".join(CFG["chromium"]))
        sys.exit(3)
    home = os.path.join(DIR, "home")
    os.makedirs(home, exist_ok=True)
    try:
        os.unlink(os.path.join(CFG["profile"], "DevToolsActivePort"))
    except OSError:
        pass
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ")}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(HOME=home, XDG_CONFIG_HOME=home + "/.config", XDG_CACHE_HOME=home + "/.cache")
    with open(os.path.join(DIR, "chromium.log"), "ab") as out:
        proc = subprocess.Popen([chromium] + CFG["args"], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd=DIR, start_new_session=True)
    with open(os.path.join(DIR, "chromium.pid"), "w") as f:
        f.write(str(proc.pid))
    log("started", chromium, "as", proc.pid)
    return proc.pid, proc


def stop(pid, why):
    log("stopping:", why)
    needle = DIR.encode()
    # Three rounds: a process forked while the group was being killed escapes the first.
    for _ in range(3):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        # Chromium's crash handler leaves the process group; it names the profile directory.
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid() and needle in cmdline(int(entry)):
                try:
                    os.kill(int(entry), signal.SIGKILL)
                except OSError:
                    pass
        time.sleep(0.2)
    os._exit(0)


def watch(pid, proc):
    path = os.path.join(DIR, "deadline")
    deadline = time.monotonic() + 60  # until the first reading
    seen = None
    while True:
        try:
            with open(path) as f:
                text = f.read()
        except FileNotFoundError:
            stop(pid, "the deadline file is gone")
        except OSError:
            text = seen
        if text != seen:
            try:
                deadline = time.monotonic() + float(json.loads(text)["remaining"])
                seen = text
            except (ValueError, KeyError, TypeError):
                pass  # being rewritten: keep the last deadline
        if time.monotonic() >= deadline:
            stop(pid, "the deadline passed")
        if (proc.poll() is not None) if proc else not pid_alive(pid):
            stop(pid, "Chromium exited")
        time.sleep(0.25)


def on_gate(conn):
    conn.settimeout(30)
    head, rest = read_head(conn)
    if head is None:
        conn.close()
        return
    headers = header_map(head)
    if not hmac.compare_digest(headers.get(b"x-pandaweb-gate", b""), SECRET):
        refuse(conn, b"403 Forbidden")
        return
    parts = head.split(b"\r\n", 1)[0].split(b" ")
    target = parts[1] if len(parts) == 3 else b""
    upgrade = headers.get(b"upgrade", b"").lower() == b"websocket"
    if target == TUNNEL:
        if not upgrade:
            refuse(conn, b"400 Bad Request")
            return
        key = headers.get(b"sec-websocket-key", b"")
        accept = base64.b64encode(hashlib.sha1(key + WS_GUID).digest())
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        conn.settimeout(None)
        IDLE.put(conn)
        return
    # Everything else is for Chromium's DevTools server. One request per connection: the
    # platform's proxy reuses connections, and only the first request on one was checked.
    try:
        upstream = socket.create_connection(("127.0.0.1", devtools_port()), timeout=10)
    except OSError:
        refuse(conn, b"502 Bad Gateway")
        return
    lines = [l for l in head.split(b"\r\n") if not l.lower().startswith(b"x-pandaweb-gate:")]
    if not upgrade:
        lines = [l for l in lines if not l.lower().startswith((b"connection:", b"keep-alive:"))]
        lines.append(b"Connection: close")
    upstream.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + (rest if upgrade else b""))
    if upgrade:
        reply, after = read_head(upstream)
        if reply is not None and reply.split(b" ")[1:2] == [b"101"]:
            conn.settimeout(None)
            upstream.settimeout(None)
            conn.sendall(reply + b"\r\n\r\n" + after)
            pipe(conn, upstream)
            return
        body = after
    else:
        reply, body = read_response(upstream)
    upstream.close()
    if reply is None:
        refuse(conn, b"502 Bad Gateway")
        return
    conn.sendall(closing(reply, body))
    conn.close()


def on_proxy(conn):
    give_up = time.monotonic() + 30
    while True:
        left = give_up - time.monotonic()
        if left <= 0:
            log("no egress tunnel from the worker within 30 s; a browser connection is refused")
            conn.close()
            return
        try:
            tunnel = IDLE.get(timeout=left)
        except queue.Empty:
            continue
        try:
            tunnel.settimeout(10)
            tunnel.sendall(b"\x01")
            taken = tunnel.recv(1)
            tunnel.settimeout(None)
        except OSError:
            taken = b""
        if taken == b"\x02":
            pipe(conn, tunnel)
            return
        tunnel.close()


def keepalive():
    while True:
        time.sleep(20)
        held = []
        while True:
            try:
                held.append(IDLE.get_nowait())
            except queue.Empty:
                break
        for tunnel in held:
            try:
                tunnel.sendall(b"\x00")
                IDLE.put(tunnel)
            except OSError:
                tunnel.close()


def listen(host, port):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def serve(sock, handler):
    def guarded(conn):
        try:
            handler(conn)
        except Exception as exc:
            log(handler.__name__, "failed:", repr(exc))
            conn.close()
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=guarded, args=(conn,), daemon=True).start()


def main():
    stop_previous_gate()
    proxy = listen("127.0.0.1", CFG["proxy_port"])
    gate = listen(CFG["gate_host"], CFG["gate_port"])
    pid, proc = start_or_adopt()
    threading.Thread(target=serve, args=(proxy, on_proxy), daemon=True).start()
    threading.Thread(target=serve, args=(gate, on_gate), daemon=True).start()
    threading.Thread(target=keepalive, daemon=True).start()
    log("gate on %s:%d," % (CFG["gate_host"], CFG["gate_port"]),
        "proxy on 127.0.0.1:%d" % CFG["proxy_port"])
    watch(pid, proc)


main()
'''


# ---------------------------------------------------------------------------------------------
# Helpers


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


def _deadline_text(remaining: float) -> str:
    # The nonce makes every write a change the gate notices, even with the same remaining time.
    return json.dumps({"remaining": remaining, "nonce": secrets.token_hex(4)})


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


class _Upstream:
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

    def __init__(self, upstream: _Upstream) -> None:
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

    def __init__(self, upstream: _Upstream, proxy_url: str, size: int) -> None:
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


class _Link:
    """The in-process half of one sandbox: its relay and its tunnels."""

    def __init__(self, upstream: _Upstream, proxy_url: str, tunnels: int) -> None:
        self.relay = _Relay(upstream)
        self.tunnels = _Tunnels(upstream, proxy_url, tunnels)

    def start(self) -> None:
        self.relay.start()
        self.tunnels.start()

    def stop(self) -> None:
        self.tunnels.stop()
        self.relay.stop()


_LINKS: dict[str, _Link] = {}
_LINKS_LOCK = threading.Lock()


def _drop_link(run_key: str) -> None:
    with _LINKS_LOCK:
        link = _LINKS.pop(run_key, None)
    if link is not None:
        link.stop()


# ---------------------------------------------------------------------------------------------
# The backend


class PandaStackBackend:
    """Chromium in a PandaStack microVM, reached through the platform's authenticated port
    proxy; see the module docstring for the gate, the relay and the tunnels."""

    name = "pandastack"

    def __init__(
        self,
        config: EngineConfig,
        *,
        client: Any = None,
        ttl_margin: float = 120.0,
        ready_timeout: float = 90.0,
        guest_dir: str = GUEST_DIR,
        gate_host: str = "0.0.0.0",  # noqa: S104 - the guest's own interface, behind the gate secret
        gate_port: int = GATE_PORT,
        guest_proxy_port: int = GUEST_PROXY_PORT,
        guest_chromium: Sequence[str] = GUEST_CHROMIUM,
        tunnels: int = 8,
        create_retry_seconds: float = 30.0,
    ) -> None:
        self._client_instance = client
        self.template = config.pandastack_template
        self.api_url = config.pandastack_api
        self.api_key = config.pandastack_api_key
        self.ttl_margin = ttl_margin
        self.ready_timeout = ready_timeout
        self.guest_dir = guest_dir.rstrip("/")
        self.gate_host = gate_host
        self.gate_port = gate_port
        self.guest_proxy_port = guest_proxy_port
        self.guest_chromium = tuple(guest_chromium)
        self.tunnels = tunnels
        self.create_retry_seconds = create_retry_seconds

    # -- the SDK ---------------------------------------------------------------------------

    def _client(self) -> Any:
        if self._client_instance is None:
            try:
                import pandastack
            except ImportError as exc:
                raise SandboxError(
                    "the pandastack backend needs the pandastack SDK: pip install "
                    "'pandastack>=0.10,<0.11'"
                ) from exc
            # Unset, the SDK falls back to its own defaults (its config file, its public API).
            client = pandastack.Client(
                api_url=self.api_url or None,
                api_key=self.api_key or None,
                max_create_retry_seconds=self.create_retry_seconds,
            )
            if not client.api_key:
                raise SandboxError(
                    "PANDASTACK_API_KEY is not set: the pandastack backend cannot reach the API"
                )
            self._client_instance = client
        return self._client_instance

    def _box(self, client: Any, sandbox_id: str) -> Any:
        from pandastack import Sandbox as RemoteSandbox

        return RemoteSandbox.from_dict({"id": sandbox_id, "status": "running"}, client=client)

    def _remote_id(self, client: Any, sandbox: Sandbox) -> str:
        sandbox_id = str(sandbox.details.get("sandbox_id", ""))
        if not sandbox_id:
            raise SandboxError(f"sandbox record of {sandbox.run_key} names no PandaStack sandbox")
        recorded = str(sandbox.details.get("api_url", ""))
        if recorded and recorded.rstrip("/") != str(client.api_url).rstrip("/"):
            # Deleting through another API would answer 404 and look like success.
            raise SandboxError(
                f"sandbox {sandbox.run_key} lives on {recorded}, but this worker's "
                f"PANDASTACK_API is {client.api_url}"
            )
        return sandbox_id

    # -- create ----------------------------------------------------------------------------

    def create(self, spec: SandboxSpec) -> Sandbox:
        from pandastack import AuthError, BadRequestError, PandastackError

        started = time.time()
        t0 = time.monotonic()
        client = self._client()
        restore = self._restore_point(spec, client)
        remote_ttl = math.ceil(spec.ttl_seconds + self.ttl_margin)
        try:
            box = client.sandboxes.create(
                template=self.template,
                ttl_seconds=remote_ttl,
                # Tags the sandbox so that one whose create response was lost can be found.
                metadata={"pandaweb_run_key": spec.run_key, "pandaweb_host": socket.gethostname()},
                from_snapshot=restore.get("snapshot_id") if restore else None,
            )
        except PandastackError as exc:
            if not isinstance(exc, AuthError | BadRequestError):
                # A 5xx, a timeout or a dropped connection may follow a create that went through.
                self._reap_tagged(client, spec.run_key)
            raise SandboxError(f"PandaStack did not create a sandbox: {exc}") from exc
        link: _Link | None = None
        try:
            upstream = _Upstream(client, box.id, self.gate_port)
            self._start_gate(box, spec, upstream.secret, adopt=restore is not None)
            link = _Link(upstream, spec.proxy_url, self.tunnels)
            link.start()
            version = self._wait_ready(box, link, t0)
            sandbox = Sandbox(
                backend=self.name,
                run_key=spec.run_key,
                cdp_url=link.relay.url,
                # Nothing runs on this host but the relay thread: no process to signal.
                pid=0,
                pgid=0,
                workdir="",
                started_at=started,
                deadline=started + spec.ttl_seconds,
                ready_seconds=time.monotonic() - t0,
                host=socket.gethostname(),
                details={
                    "isolation": "firecracker microVM (PandaStack, remote)",
                    "sandbox_id": box.id,
                    "api_url": client.api_url,
                    "template": self.template,
                    "remote_ttl_seconds": remote_ttl,
                    "restored_from": restore.get("snapshot_id", "") if restore else "",
                    "browser": version.get("Browser", ""),
                    "proxy_url": spec.proxy_url,
                    "window_size": list(spec.window_size),
                    "extra_args": list(spec.extra_args),
                    "guest_dir": self.guest_dir,
                    "gate_port": self.gate_port,
                    "isolation_warning": _ISOLATION_WARNING,
                },
            )
        except BaseException as exc:
            # BaseException: a Ctrl-C or a Celery soft timeout must not leave a VM running.
            if link is not None:
                link.stop()
            note = self._kill_quietly(client, box.id, remote_ttl)
            if isinstance(exc, SandboxError):
                raise SandboxError(f"{exc}{note}") from exc
            if isinstance(exc, PandastackError | OSError):
                raise SandboxError(f"the PandaStack sandbox did not start: {exc}{note}") from exc
            raise
        with _LINKS_LOCK:
            _LINKS[spec.run_key] = link
        return sandbox

    def _restore_point(self, spec: SandboxSpec, client: Any) -> dict[str, Any] | None:
        source = str(getattr(spec, "restore_from", "") or "")
        if not source:
            return None
        try:
            point = json.loads(Path(source).read_text())
        except (OSError, ValueError):
            raise SandboxError(f"the saved browser {source} is missing or unreadable") from None
        if not isinstance(point, dict) or point.get("backend") != self.name:
            raise SandboxError(f"{source} is not a PandaStack snapshot reference")
        if str(point.get("api_url", "")).rstrip("/") != str(client.api_url).rstrip("/"):
            raise SandboxError(f"{source} was saved on {point.get('api_url')}, not here")
        # The restored Chromium keeps running with the flags it was started with.
        if point.get("window_size") != list(spec.window_size) or point.get("extra_args") != list(
            spec.extra_args
        ):
            raise SandboxError(
                f"{source} holds a browser started with another window size or other flags"
            )
        return point

    def _guest_args(self, spec: SandboxSpec) -> list[str]:
        scheme = urlsplit(spec.proxy_url).scheme
        width, height = spec.window_size
        # The run's proxy URL names the worker's loopback; in the guest the same flags point at
        # the gate, whose tunnels end at that proxy. A caller's copy of the worker-side flags
        # would route to nothing in the guest, so it is dropped.
        extra = [arg for arg in spec.extra_args if arg not in spec.fixed_flags]
        return [
            "--headless=new",
            "--remote-debugging-port=0",
            f"--user-data-dir={self.guest_dir}/profile",
            *HEADLESS_ARGS,
            *chromium_proxy_args(f"{scheme}://127.0.0.1:{self.guest_proxy_port}"),
            f"--window-size={width},{height}",
            *extra,
            "about:blank",
        ]

    def _start_gate(self, box: Any, spec: SandboxSpec, secret: str, *, adopt: bool) -> None:
        from pandastack import CommandFailed

        d = self.guest_dir
        config = {
            "dir": d,
            "secret": secret,
            "profile": f"{d}/profile",
            "gate_host": self.gate_host,
            "gate_port": self.gate_port,
            "proxy_port": self.guest_proxy_port,
            "tunnel_path": TUNNEL_PATH,
            "chromium": list(self.guest_chromium),
            "args": self._guest_args(spec),
            "adopt": adopt,
        }
        qd = shlex.quote(d)
        try:
            box.exec(f"mkdir -p {qd} && chmod 700 {qd}", check=True)
        except CommandFailed as exc:
            raise SandboxError(f"could not prepare {d} in the sandbox: {exc.stderr}") from exc
        # The directory is 0700 before the secret is written into it.
        box.filesystem.write(f"{d}/gate.json", json.dumps(config))
        box.filesystem.write(f"{d}/gate.py", _GATE_SOURCE)
        box.filesystem.write(f"{d}/deadline", _deadline_text(spec.ttl_seconds))
        result = box.exec(
            f"cd {qd} && chmod 600 gate.json && "
            "if ! command -v python3 >/dev/null 2>&1; then "
            "echo 'python3 is not installed in this template' >&2; exit 127; fi && "
            f"(setsid nohup python3 {qd}/gate.py {qd}/gate.json >>{qd}/gate.log 2>&1 </dev/null &)"
        )
        if result.exit_code != 0:
            raise SandboxError(
                f"could not start pandaweb's gate in the sandbox: "
                f"{(result.stderr or result.stdout).strip()}"
            )

    def _wait_ready(self, box: Any, link: _Link, t0: float) -> dict[str, Any]:
        """Wait until CDP answers through the relay (the path the runner will take) and the
        first egress tunnel is open."""
        while True:
            version = json_version(link.relay.url, timeout=5.0)
            relayed = str((version or {}).get("webSocketDebuggerUrl", ""))
            if relayed.startswith(f"ws://127.0.0.1:{link.relay.port}/") and (
                link.tunnels.connected.is_set()
            ):
                assert version is not None
                return version
            if link.tunnels.gone.is_set():
                raise SandboxError("the PandaStack sandbox disappeared while starting")
            if time.monotonic() - t0 > self.ready_timeout:
                tail = self._guest_log_tail(box)
                what = (
                    "its debugging port did not answer"
                    if version is None
                    else ("no egress tunnel could be opened")
                )
                raise SandboxError(
                    f"the browser in the PandaStack sandbox was not ready within "
                    f"{self.ready_timeout:g} s: {what}"
                    + (f"; last lines of the guest's logs:\n{tail}" if tail else "")
                )
            time.sleep(0.25)

    def _guest_log_tail(self, box: Any, lines: int = 8) -> str:
        kept: list[str] = []
        for name in ("gate.log", "chromium.log"):
            with contextlib.suppress(Exception):
                text = box.filesystem.read(f"{self.guest_dir}/{name}").decode(errors="replace")
                kept += [
                    f"{name}: {line}"
                    for line in text.splitlines()
                    if line.strip() and "dbus" not in line.lower()
                ][-lines:]
        return "\n".join(kept)

    def _kill_quietly(self, client: Any, sandbox_id: str, remote_ttl: int) -> str:
        """Kill a sandbox whose start failed; what to add to the error if that failed too."""
        from pandastack import NotFoundError

        try:
            client.sandboxes.delete(sandbox_id)
        except NotFoundError:
            pass
        except Exception as exc:
            logger.warning("could not kill PandaStack sandbox %s: %s", sandbox_id, exc)
            return (
                f" (and the sandbox {sandbox_id} could not be killed: {exc}; PandaStack deletes "
                f"it after {remote_ttl} s without requests)"
            )
        return ""

    def _reap_tagged(self, client: Any, run_key: str) -> None:
        from pandastack import NotFoundError

        try:
            boxes = client.sandboxes.list()
        except Exception:
            logger.warning("could not list PandaStack sandboxes to find one for %s", run_key)
            return
        for box in boxes:
            if box.metadata.get("pandaweb_run_key") != run_key:
                continue
            try:
                client.sandboxes.delete(box.id)
            except NotFoundError:
                pass
            except Exception:
                logger.warning("could not kill PandaStack sandbox %s", box.id)

    # -- the rest --------------------------------------------------------------------------

    def destroy(self, sandbox: Sandbox) -> None:
        from pandastack import NotFoundError, PandastackError

        _drop_link(sandbox.run_key)
        client = self._client()
        sandbox_id = self._remote_id(client, sandbox)
        try:
            client.sandboxes.delete(sandbox_id)
        except NotFoundError:
            return
        except PandastackError as exc:
            ttl = sandbox.details.get("remote_ttl_seconds", "its TTL")
            raise SandboxError(
                f"could not kill PandaStack sandbox {sandbox_id}: {exc}; PandaStack deletes it "
                f"after {ttl} s without requests"
            ) from exc

    def alive(self, sandbox: Sandbox) -> bool:
        """Whether Chromium answers through the gate. Note: like every request naming the
        sandbox, this counts as activity for PandaStack's idle TTL."""
        client = self._client()
        sandbox_id = self._remote_id(client, sandbox)
        upstream = _Upstream(client, sandbox_id, int(sandbox.details.get("gate_port", GATE_PORT)))
        try:
            response = upstream.request("GET", "/json/version", None, timeout=10)
            return response.status_code == 200 and isinstance(response.json(), dict)
        except Exception:
            return False

    def extend(self, sandbox: Sandbox, deadline: float) -> None:
        from pandastack import NotFoundError, PandastackError

        client = self._client()
        sandbox_id = self._remote_id(client, sandbox)
        gone = SandboxError(f"sandbox {sandbox.run_key} is gone; its deadline cannot move")
        if not self.alive(sandbox):
            raise gone
        remaining = deadline - time.time()
        box = self._box(client, sandbox_id)
        guest_dir = str(sandbox.details.get("guest_dir", self.guest_dir))
        try:
            box.set_ttl(math.ceil(max(remaining, 0.0) + self.ttl_margin))
            box.filesystem.write(f"{guest_dir}/deadline", _deadline_text(remaining))
        except NotFoundError:
            raise gone from None
        except PandastackError as exc:
            raise SandboxError(f"could not move the deadline of {sandbox.run_key}: {exc}") from exc
        # The gate may have read the old deadline just before the write and be killing it.
        if not self.alive(sandbox):
            raise gone
        sandbox.deadline = deadline

    def snapshot(self, sandbox: Sandbox, destination: Path) -> None:
        """Save the VM (memory and disk) on PandaStack, write a reference to it at
        ``destination`` for ``SandboxSpec.restore_from``, and destroy the sandbox.

        The gate is stopped first, so a restored copy does not wake up with this run's secret and
        deadline; Chromium keeps running into the snapshot and the new sandbox's gate adopts it.
        """
        from pandastack import PandastackError

        client = self._client()
        sandbox_id = self._remote_id(client, sandbox)
        box = self._box(client, sandbox_id)
        guest_dir = shlex.quote(str(sandbox.details.get("guest_dir", self.guest_dir)))
        try:
            _drop_link(sandbox.run_key)
            box.exec(f'kill -KILL "$(cat {guest_dir}/gate.pid)" 2>/dev/null; true')
            snapshot_id = box.snapshot()
            if not snapshot_id:
                raise SandboxError("PandaStack answered the snapshot without an id")
            point = {
                "backend": self.name,
                "snapshot_id": snapshot_id,
                "api_url": client.api_url,
                "template": sandbox.details.get("template", self.template),
                "window_size": sandbox.details.get("window_size"),
                "extra_args": sandbox.details.get("extra_args", []),
                "saved_at": time.time(),
            }
            partial = destination.with_name(f".{destination.name}.{os.getpid()}")
            partial.write_text(json.dumps(point, indent=2))
            partial.replace(destination)
        except PandastackError as exc:
            raise SandboxError(f"could not snapshot the PandaStack sandbox: {exc}") from exc
        finally:
            self.destroy(sandbox)
