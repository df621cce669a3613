"""The ``pandastack`` sandbox backend, against a fake PandaStack API.

The real PandaStack service (its API, its Firecracker hosts, the ``browser`` template) cannot
run here, and there is no network to reach the hosted one. These tests start ``FakePandaStack``:
an ``http.server`` on 127.0.0.1 that answers exactly the REST calls the ``pandastack`` SDK 0.10.0
makes, with the paths and JSON shapes read from the SDK's source and from the platform's open
agent (``agent/internal/api``), and records every call. The microVM is played by this machine:
``exec`` runs the command here (only commands naming the test's guest directory), ``fs`` reads
and writes files here, and the authenticated port proxy ``/v1/sandboxes/{id}/proxy/{port}/...``
forwards to 127.0.0.1:{port} with the API key stripped and Host set to the guest's address, as
the agent's proxy does.

So the gate program, the loopback relay, the egress tunnels, the run's real ``EgressProxy`` and
a real Chromium all run for real. What these tests cannot show: that the hosted API, its edge
(TLS, load balancers) and the ``browser`` template behave like the fake (Python 3 and Chromium
present in the template, raw bytes passed after a WebSocket upgrade, how long a create takes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import math
import os
import re
import signal
import socket
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psutil
import pytest
from django.conf import settings
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Playwright

from sessions.engine.chromium import find_chromium
from sessions.engine.config import EngineConfig
from sessions.engine.egress_policy import EgressPolicy
from sessions.engine.proxy import DeniedAttempt, EgressProxy
from sessions.engine.sandbox.backends import get_backend
from sessions.engine.sandbox.base import Sandbox, SandboxError, SandboxSpec
from sessions.engine.sandbox.pandastack import PandaStackBackend
from sessions.engine.sandbox.pandastack_link import GATE_HEADER

pytest.importorskip("pandastack")

KEY = "pds_test_0123456789abcdef"
_PROXY_ROUTE = re.compile(r"^/v1/sandboxes/([^/]+)/proxy/(\d+)(/.*)?$")
_SANDBOX_ROUTE = re.compile(r"^/v1/sandboxes/([^/]+)(/[a-z/]+)?$")
_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length"})


# --- the fake PandaStack API -----------------------------------------------------------------


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    auth: str


@dataclass
class FakeState:
    sandboxes: dict[str, dict[str, Any]] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)
    guest_dirs: dict[str, Path] = field(default_factory=dict)
    snapshots: dict[str, str] = field(default_factory=dict)  # snapshot id -> sandbox id
    # (status, JSON) to answer the next create with, after creating the sandbox anyway: a
    # response lost on the way back.
    lose_create_response: tuple[int, dict[str, Any]] | None = None


class FakePandaStack(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, guest_root: Path) -> None:
        super().__init__(("127.0.0.1", 0), FakeHandler)
        self.guest_root = guest_root
        self.calls: list[Call] = []
        self.state = FakeState()
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def api_calls(self, method: str | None = None, suffix: str = "") -> list[Call]:
        """Calls other than the port proxy's, optionally filtered."""
        return [
            c
            for c in self.calls
            if "/proxy/" not in c.path
            and (method is None or c.method == method)
            and c.path.endswith(suffix)
        ]

    def kill_guest(self, sandbox_id: str) -> None:
        """What deleting a microVM does to everything running in it."""
        guest = self.state.guest_dirs.get(sandbox_id)
        if guest is not None:
            for proc in processes_naming(str(guest)):
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()


class FakeHandler(BaseHTTPRequestHandler):
    server: FakePandaStack
    protocol_version = "HTTP/1.1"
    rbufsize = 0  # unbuffered: after an upgrade the socket itself is piped

    def do_GET(self) -> None:
        self.route()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def route(self) -> None:
        parts = urlsplit(self.path)
        upgrade = self.headers.get("Upgrade", "").lower() == "websocket"
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length and not upgrade else b""
        body: Any = raw
        if "json" in self.headers.get("Content-Type", ""):
            body = json.loads(raw or b"null")
        auth = self.headers.get("Authorization", "")
        with self.server.lock:
            self.server.calls.append(
                Call(self.command, parts.path, parse_qs(parts.query), body, auth)
            )
        if auth != f"Bearer {KEY}":
            self.reply(401, {"error": "invalid or missing API token"})
            return
        if m := _PROXY_ROUTE.match(parts.path):
            self.proxy(m[1], int(m[2]), (m[3] or "/") + (f"?{parts.query}" if parts.query else ""))
            return
        if parts.path == "/v1/sandboxes":
            if self.command == "POST":
                self.create(body)
            else:
                live = [s for i, s in self.server.state.sandboxes.items() if i not in self.gone()]
                self.reply(200, live)
            return
        m = _SANDBOX_ROUTE.match(parts.path)
        if m is None:
            self.reply(404, {"error": "no such route"})
            return
        sandbox_id, tail = m[1], m[2] or ""
        if sandbox_id in self.gone():
            self.reply(404, {"error": "sandbox not found"})
            return
        handler = {
            ("GET", ""): self.get_one,
            ("DELETE", ""): self.delete,
            ("POST", "/exec"): self.exec,
            ("PUT", "/fs"): self.write,
            ("GET", "/fs"): self.read,
            ("PATCH", "/lifecycle"): self.lifecycle,
            ("POST", "/snapshots"): self.snapshot,
        }.get((self.command, tail))
        if handler is None:
            self.reply(404, {"error": "no such route"})
            return
        handler(sandbox_id, body, parse_qs(parts.query))

    def gone(self) -> set[str]:
        return self.server.state.deleted

    # -- sandboxes --------------------------------------------------------------------------

    def create(self, body: dict[str, Any]) -> None:
        state = self.server.state
        sandbox_id = str(uuid.uuid4())
        record = {
            "id": sandbox_id,
            "template": body.get("template", "code-interpreter"),
            "cpu": 2,
            "memory_mb": 2048,
            "status": "running",
            "guest_ip": "127.0.0.1",
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "metadata": body.get("metadata") or {},
            "from_snapshot": body.get("from_snapshot"),
            "boot_ms": 120,
            "boot_mode": "snapshot" if body.get("from_snapshot") else "cold",
            "ttl_seconds": body.get("ttl_seconds"),
        }
        with self.server.lock:
            state.sandboxes[sandbox_id] = record
            if body.get("from_snapshot"):
                # A memory snapshot: the new VM wakes up with the old one's processes and files.
                source = state.snapshots[body["from_snapshot"]]
                state.guest_dirs[sandbox_id] = state.guest_dirs[source]
            lost, state.lose_create_response = state.lose_create_response, None
        if lost is not None:
            self.reply(*lost)
            return
        self.reply(201, record)

    def get_one(self, sandbox_id: str, body: Any, query: dict[str, list[str]]) -> None:
        self.reply(200, self.server.state.sandboxes[sandbox_id])

    def delete(self, sandbox_id: str, body: Any, query: dict[str, list[str]]) -> None:
        state = self.server.state
        with self.server.lock:
            state.deleted.add(sandbox_id)
            snapshotted = sandbox_id in state.snapshots.values()
        if not snapshotted:
            self.server.kill_guest(sandbox_id)
        self.reply(204, None)

    def exec(self, sandbox_id: str, body: dict[str, Any], query: dict[str, list[str]]) -> None:
        command = body["cmd"]
        if str(self.server.guest_root) not in command:
            # The fake runs commands on the test machine: only the backend's own, which all
            # name its guest directory, are allowed.
            self.reply(200, {"stdout": "", "stderr": "refused by the fake", "exit_code": 126})
            return
        done = subprocess.run(
            ["/bin/sh", "-c", command],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
        )
        self.reply(
            200, {"stdout": done.stdout, "stderr": done.stderr, "exit_code": done.returncode}
        )

    def _guest_path(self, query: dict[str, list[str]]) -> Path | None:
        path = Path(query.get("path", [""])[0])
        return path if path.is_relative_to(self.server.guest_root) else None

    def write(self, sandbox_id: str, body: bytes, query: dict[str, list[str]]) -> None:
        path = self._guest_path(query)
        if path is None:
            self.reply(500, {"error": "the fake writes only under the test's guest directory"})
            return
        path.write_bytes(body)
        with self.server.lock:
            self.server.state.guest_dirs.setdefault(sandbox_id, path.parent)
        self.reply(200, {"path": str(path), "bytes": len(body)})

    def read(self, sandbox_id: str, body: Any, query: dict[str, list[str]]) -> None:
        path = self._guest_path(query)
        if path is None or not path.is_file():
            self.reply(404, {"error": "open: no such file or directory"})
            return
        data = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def lifecycle(self, sandbox_id: str, body: dict[str, Any], query: dict[str, Any]) -> None:
        record = self.server.state.sandboxes[sandbox_id]
        record["ttl_seconds"] = body.get("ttl_seconds", record["ttl_seconds"])
        self.reply(
            200, {"ttl_seconds": record["ttl_seconds"], "persistent": False, "idle_seconds": 0}
        )

    def snapshot(self, sandbox_id: str, body: Any, query: dict[str, list[str]]) -> None:
        snapshot_id = f"snap-{uuid.uuid4().hex[:12]}"
        with self.server.lock:
            self.server.state.snapshots[snapshot_id] = sandbox_id
        record = self.server.state.sandboxes[sandbox_id]
        self.reply(
            201,
            {"id": snapshot_id, "sandbox_id": sandbox_id, "template": record["template"]},
        )

    # -- the port proxy ---------------------------------------------------------------------

    def proxy(self, sandbox_id: str, port: int, target: str) -> None:
        if sandbox_id not in self.server.state.sandboxes or sandbox_id in self.gone():
            self.reply(404, {"error": "sandbox not found"})
            return
        headers = [
            (name, value)
            for name, value in self.headers.items()
            if name.lower() not in {"authorization", "host", "content-length"}
        ]
        # Like the agent: Host becomes the guest's address, the API token is stripped.
        headers += [("Host", f"127.0.0.1:{port}"), ("X-Forwarded-Host", self.headers["Host"])]
        if self.headers.get("Upgrade", "").lower() == "websocket":
            try:
                upstream = socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError as exc:
                self.reply(502, {"error": f"upstream: {exc}"})
                return
            lines = [f"{self.command} {target} HTTP/1.1", *(f"{n}: {v}" for n, v in headers)]
            upstream.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            upstream.settimeout(None)
            self.close_connection = True
            pipe(self.connection, upstream)
            return
        length = int(self.headers.get("Content-Length") or 0)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request(self.command, target, body=b"" if length else None, headers=dict(headers))
            response = conn.getresponse()
            data = response.read()
        except OSError as exc:
            self.reply(502, {"error": f"upstream: {exc}"})
            return
        finally:
            conn.close()
        self.send_response(response.status)
        for name, value in response.getheaders():
            if name.lower() not in _HOP:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def reply(self, status: int, payload: Any) -> None:
        data = b"" if status == 204 else json.dumps(payload).encode()
        self.send_response(status)
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


# --- helpers ---------------------------------------------------------------------------------


def pipe(a: socket.socket, b: socket.socket) -> None:
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
    b.close()


def processes_naming(path: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
            continue
        if path in " ".join(proc.info["cmdline"] or ()):
            found.append(proc)
    return found


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= end:
            return False
        time.sleep(interval)
    return True


def free_ports(count: int) -> list[int]:
    """Ports free right now, all different (each is held until all are chosen)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


class Site(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, title: str) -> None:
        super().__init__(("127.0.0.1", 0), SiteHandler)
        self.title = title
        self.seen: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class SiteHandler(BaseHTTPRequestHandler):
    server: Site

    def do_GET(self) -> None:
        self.server.seen.append(self.path)
        body = f"<!doctype html><title>{self.server.title}</title><h1>hello</h1>".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serving(server: ThreadingHTTPServer) -> Iterator[Any]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def run_key() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def direct_get(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 - a loopback URL
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture
def guest_root(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "guests"
    root.mkdir()
    yield root
    for proc in processes_naming(str(root)):  # whatever a failed test left running
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGKILL)


@pytest.fixture
def fake(guest_root: Path) -> Iterator[Any]:
    with serving(FakePandaStack(guest_root)) as server:
        yield server


@pytest.fixture
def config(fake: FakePandaStack) -> EngineConfig:
    """The engine's settings that point the backend at the fake API, with the test's key."""
    return EngineConfig(pandastack_api=fake.url, pandastack_api_key=KEY)


@pytest.fixture
def portal() -> Iterator[Site]:
    with serving(Site("Portal")) as site:
        yield site


@pytest.fixture
def unlisted() -> Iterator[Site]:
    with serving(Site("Unlisted")) as site:
        yield site


@pytest.fixture
def denials() -> list[DeniedAttempt]:
    return []


@pytest.fixture
def egress(portal: Site, denials: list[DeniedAttempt]) -> Iterator[EgressProxy]:
    """The run's real egress proxy, on the worker's loopback, allowing the portal only."""
    proxy = EgressProxy(
        EgressPolicy([f"127.0.0.1:{portal.server_address[1]}"]), on_denied=denials.append
    )
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.fixture
def make(
    fake: FakePandaStack, config: EngineConfig, guest_root: Path, egress: EgressProxy
) -> Iterator[Callable[..., tuple[PandaStackBackend, Sandbox]]]:
    """Create sandboxes, each in a guest directory of its own (a VM of its own); whatever a test
    leaves is destroyed after it."""
    made: list[tuple[PandaStackBackend, Sandbox]] = []
    chromium = find_chromium(settings.ENGINE_CONFIG.chromium)

    def factory(
        guest: Path | None = None, backend_args: dict[str, Any] | None = None, **spec_args: Any
    ) -> tuple[PandaStackBackend, Sandbox]:
        guest = guest or guest_root / f"vm-{len(made)}-{uuid.uuid4().hex[:6]}"
        gate_port, guest_proxy_port = free_ports(2)
        options: dict[str, Any] = {
            "guest_dir": str(guest),
            "gate_host": "127.0.0.1",
            "gate_port": gate_port,
            "guest_proxy_port": guest_proxy_port,
            "guest_chromium": [chromium or "chromium"],
            "ready_timeout": 30,
            "tunnels": 4,
            **(backend_args or {}),
        }
        backend = PandaStackBackend(config, **options)
        spec = SandboxSpec(
            **{
                "run_key": run_key(),
                "proxy_url": egress.url,
                "ttl_seconds": 120.0,
                **spec_args,
            }
        )
        sandbox = backend.create(spec)
        made.append((backend, sandbox))
        return backend, sandbox

    yield factory
    for backend, sandbox in made:
        with contextlib.suppress(SandboxError):
            backend.destroy(sandbox)


# --- without a browser -----------------------------------------------------------------------


def test_importing_the_module_registers_the_backend(config: EngineConfig) -> None:
    backend = get_backend("pandastack", config)
    assert isinstance(backend, PandaStackBackend)
    assert backend.name == "pandastack"
    assert backend.template == "browser"


def test_it_refuses_to_work_without_an_api_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Without a key in the settings the SDK looks in its own places: none has one here.
    monkeypatch.delenv("PANDASTACK_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    spec = SandboxSpec(run_key=run_key(), proxy_url="http://127.0.0.1:9", ttl_seconds=60)
    with pytest.raises(SandboxError, match="PANDASTACK_API_KEY"):
        PandaStackBackend(EngineConfig()).create(spec)


def test_a_lost_create_response_is_reconciled_by_its_tag(
    fake: FakePandaStack, config: EngineConfig
) -> None:
    """A 502 may follow a create that went through: the sandbox tagged with the run key is
    looked up and killed."""
    fake.state.lose_create_response = (502, {"error": "agent unreachable"})
    key = run_key()
    spec = SandboxSpec(run_key=key, proxy_url="http://127.0.0.1:9", ttl_seconds=60)
    with pytest.raises(SandboxError, match="did not create a sandbox: agent unreachable"):
        PandaStackBackend(config).create(spec)
    (created,) = fake.state.sandboxes.values()
    assert created["metadata"]["pandaweb_run_key"] == key
    assert [c.path for c in fake.api_calls("GET")] == ["/v1/sandboxes"]
    assert [c.path for c in fake.api_calls("DELETE")] == [f"/v1/sandboxes/{created['id']}"]


def test_a_refused_create_is_not_reconciled(fake: FakePandaStack, config: EngineConfig) -> None:
    fake.state.lose_create_response = (400, {"error": "invalid template name"})
    spec = SandboxSpec(run_key=run_key(), proxy_url="http://127.0.0.1:9", ttl_seconds=60)
    with pytest.raises(SandboxError, match="invalid template name"):
        PandaStackBackend(config).create(spec)
    assert fake.api_calls("GET") == []
    assert fake.api_calls("DELETE") == []


def test_a_sandbox_whose_browser_never_starts_is_killed(
    fake: FakePandaStack, config: EngineConfig, guest_root: Path, egress: EgressProxy
) -> None:
    gate_port, guest_proxy_port = free_ports(2)
    backend = PandaStackBackend(
        config,
        guest_dir=str(guest_root / "vm"),
        gate_host="127.0.0.1",
        gate_port=gate_port,
        guest_proxy_port=guest_proxy_port,
        guest_chromium=["no-such-chromium"],
        ready_timeout=6,
    )
    spec = SandboxSpec(run_key=run_key(), proxy_url=egress.url, ttl_seconds=60)
    with pytest.raises(SandboxError, match="no Chromium in this guest"):
        backend.create(spec)
    (created,) = fake.state.sandboxes
    assert [c.path for c in fake.api_calls("DELETE")] == [f"/v1/sandboxes/{created}"]


# --- with a real Chromium in the stand-in guest ----------------------------------------------


@pytest.mark.browser
def test_it_runs_the_browser_behind_the_gate_and_the_runs_proxy(
    fake: FakePandaStack,
    make: Callable[..., tuple[PandaStackBackend, Sandbox]],
    portal: Site,
    unlisted: Site,
    egress: EgressProxy,
    denials: list[DeniedAttempt],
    playwright_instance: Playwright,
) -> None:
    backend, sandbox = make()
    sandbox_id = sandbox.details["sandbox_id"]

    # The REST calls: every one with the configured key, the TTL kept server side.
    assert {c.auth for c in fake.calls} == {f"Bearer {KEY}"}
    (create,) = fake.api_calls("POST", "/v1/sandboxes")
    assert create.body["template"] == "browser"
    assert create.body["ttl_seconds"] == math.ceil(120 + backend.ttl_margin)
    assert create.body["metadata"]["pandaweb_run_key"] == sandbox.run_key
    assert "from_snapshot" not in create.body
    written = {c.query["path"][0].rsplit("/", 1)[1] for c in fake.api_calls("PUT", "/fs")}
    assert written == {"gate.py", "gate.json", "deadline"}
    assert fake.api_calls("POST", "/exec")

    # The record.
    assert sandbox.backend == "pandastack"
    assert sandbox.cdp_url.startswith("http://127.0.0.1:")
    assert sandbox.deadline == pytest.approx(sandbox.started_at + 120)
    assert sandbox.details["isolation_warning"]
    assert Sandbox.from_dict(json.loads(json.dumps(sandbox.to_dict()))) == sandbox

    # The API key stays on the worker; the secret file is private.
    guest = Path(sandbox.details["guest_dir"])
    for path in guest.glob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes()
    assert stat.S_IMODE(guest.stat().st_mode) == 0o700
    assert stat.S_IMODE((guest / "gate.json").stat().st_mode) == 0o600

    # Through the platform's port proxy, the gate answers only requests carrying its secret
    # (the platform's public preview URLs carry none).
    proxied = f"{fake.url}/v1/sandboxes/{sandbox_id}/proxy/{sandbox.details['gate_port']}"
    status, _ = direct_get(f"{proxied}/json/version", {"Authorization": f"Bearer {KEY}"})
    assert status == 403
    status, _ = direct_get(f"{proxied}/json/version", {GATE_HEADER: "guess"})
    assert status == 401

    # The loopback relay signs what it passes on, so it passes on nothing to a local process
    # that does not hold its secret, which only cdp_url carries.
    relay = urlsplit(sandbox.cdp_url)
    relay_secret = relay.path.strip("/")
    assert len(relay_secret) >= 40
    for unsigned in ("/json/version", f"/{relay_secret[:-1]}/json/version", "/devtools/browser/x"):
        status, body = direct_get(f"http://127.0.0.1:{relay.port}{unsigned}", {})
        assert status == 403, unsigned
        assert b"devtools" not in body
    with pytest.raises(PlaywrightError):
        playwright_instance.chromium.connect_over_cdp(
            f"http://127.0.0.1:{relay.port}", timeout=5_000
        )
    version = json.loads(direct_get(f"{sandbox.cdp_url}/json/version", {})[1])
    assert urlsplit(version["webSocketDebuggerUrl"]).path.startswith(f"/{relay_secret}/devtools/")

    # The runner's way in: connect_over_cdp on the loopback relay.
    browser = playwright_instance.chromium.connect_over_cdp(sandbox.cdp_url, timeout=15_000)
    try:
        page = browser.contexts[0].new_page()
        page.goto(f"{portal.url}/invoices", timeout=15_000)
        assert page.title() == "Portal"
        # Out through the tunnel to the run's egress proxy, which refuses what is not allowed.
        # The refusal is a failed connection, which the page cannot take for an answer.
        with pytest.raises(PlaywrightError, match="net::ERR_"):
            page.goto(f"{unlisted.url}/secret", timeout=15_000)
    finally:
        browser.close()
    assert "/invoices" in portal.seen
    assert unlisted.seen == []
    assert any(d.host == "127.0.0.1" and d.port == unlisted.server_address[1] for d in denials)
    assert egress.allowed_count >= 1

    # alive and extend.
    assert backend.alive(sandbox)
    target = time.time() + 600
    backend.extend(sandbox, target)
    assert sandbox.deadline == target
    (patch,) = fake.api_calls("PATCH", "/lifecycle")
    assert 600 + backend.ttl_margin - 5 <= patch.body["ttl_seconds"] <= 600 + backend.ttl_margin
    assert json.loads((guest / "deadline").read_text())["remaining"] == pytest.approx(600, abs=5)
    assert backend.alive(sandbox)

    # destroy: a kill on the API, the relay closed; again is fine (404 means gone).
    backend.destroy(sandbox)
    assert [c.path for c in fake.api_calls("DELETE")] == [f"/v1/sandboxes/{sandbox_id}"]
    assert not backend.alive(sandbox)
    with (
        pytest.raises(ConnectionRefusedError),
        socket.create_connection(
            ("127.0.0.1", int(urlsplit(sandbox.cdp_url).port or 0)), timeout=2
        ),
    ):
        pass
    backend.destroy(sandbox)
    # The SDK resends a DELETE answered 404 once (its guard against a lagging API edge).
    deletes = fake.api_calls("DELETE")
    assert len(deletes) == 3
    assert {c.path for c in deletes} == {f"/v1/sandboxes/{sandbox_id}"}


@pytest.mark.browser
def test_the_gate_kills_the_browser_at_the_deadline(
    make: Callable[..., tuple[PandaStackBackend, Sandbox]],
) -> None:
    backend, sandbox = make(ttl_seconds=4)
    assert backend.alive(sandbox)
    assert wait_for(lambda: not backend.alive(sandbox), 20)
    guest = Path(sandbox.details["guest_dir"])
    assert "the deadline passed" in (guest / "gate.log").read_text()
    assert wait_for(lambda: not processes_naming(str(guest / "profile")), 10)
    with pytest.raises(SandboxError, match="is gone"):
        backend.extend(sandbox, time.time() + 600)


@pytest.mark.browser
@pytest.mark.skipif(
    "restore_from" not in {f.name for f in dataclasses.fields(SandboxSpec)},
    reason="SandboxSpec has no restore_from",
)
def test_a_snapshot_wakes_up_as_a_new_sandbox_with_the_same_browser(
    fake: FakePandaStack,
    make: Callable[..., tuple[PandaStackBackend, Sandbox]],
    portal: Site,
    playwright_instance: Playwright,
    tmp_path: Path,
) -> None:
    backend, sandbox = make()
    guest = Path(sandbox.details["guest_dir"])
    chromium_pid = int((guest / "chromium.pid").read_text())
    saved = tmp_path / "saved.json"

    backend.snapshot(sandbox, saved)
    point = json.loads(saved.read_text())
    (snap,) = fake.api_calls("POST", "/snapshots")
    assert snap.path == f"/v1/sandboxes/{sandbox.details['sandbox_id']}/snapshots"
    assert point["snapshot_id"] in fake.state.snapshots
    assert [c.path for c in fake.api_calls("DELETE")] == [
        f"/v1/sandboxes/{sandbox.details['sandbox_id']}"
    ]

    _, restored = make(
        guest=guest,
        backend_args={
            "gate_port": sandbox.details["gate_port"],
            "guest_proxy_port": backend.guest_proxy_port,
        },
        restore_from=str(saved),
    )
    creates = fake.api_calls("POST", "/v1/sandboxes")
    assert creates[-1].body["from_snapshot"] == point["snapshot_id"]
    assert restored.details["restored_from"] == point["snapshot_id"]
    assert int((guest / "chromium.pid").read_text()) == chromium_pid  # adopted, not restarted
    assert "adopting the running Chromium" in (guest / "gate.log").read_text()

    browser = playwright_instance.chromium.connect_over_cdp(restored.cdp_url, timeout=15_000)
    try:
        page = browser.contexts[0].new_page()
        page.goto(f"{portal.url}/after-restore", timeout=15_000)
        assert page.title() == "Portal"
    finally:
        browser.close()
    assert "/after-restore" in portal.seen


@pytest.mark.browser
@pytest.mark.skipif(
    "restore_from" not in {f.name for f in dataclasses.fields(SandboxSpec)},
    reason="SandboxSpec has no restore_from",
)
def test_a_snapshot_whose_browser_is_gone_is_refused_not_replaced(
    fake: FakePandaStack,
    make: Callable[..., tuple[PandaStackBackend, Sandbox]],
    tmp_path: Path,
) -> None:
    """A fresh browser would silently lack the logged-in session the snapshot was taken for."""
    backend, sandbox = make()
    guest = Path(sandbox.details["guest_dir"])
    saved = tmp_path / "saved.json"
    backend.snapshot(sandbox, saved)
    for proc in processes_naming(str(guest / "profile")):
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    assert wait_for(lambda: not processes_naming(str(guest / "profile")), 10)

    with pytest.raises(SandboxError, match="no running Chromium to adopt"):
        make(
            guest=guest,
            backend_args={
                "gate_port": sandbox.details["gate_port"],
                "guest_proxy_port": backend.guest_proxy_port,
                "ready_timeout": 6,
            },
            restore_from=str(saved),
        )
    restore_call = fake.api_calls("POST", "/v1/sandboxes")[-1]
    assert restore_call.body["from_snapshot"] == json.loads(saved.read_text())["snapshot_id"]
    assert len(fake.api_calls("DELETE")) == 2  # the snapshotted one, then the refused restore
