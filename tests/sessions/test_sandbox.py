"""The sandbox interface and its local backend, against a real Chromium.

Every browser test runs twice: plain (a process group) and in namespaces, which must behave the
same from the outside. What only namespaces add is tested in ``test_sandbox_namespaces.py``.
Timing assertions poll with generous limits: these tests share a 2-core machine with others.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import pytest
from playwright.sync_api import Browser, Playwright
from playwright.sync_api import Error as PlaywrightError

from sessions.engine.config import EngineConfig
from sessions.engine.sandbox import _proc, namespaces
from sessions.engine.sandbox._proc import MARKER, group_alive, mentions, remove_workdir
from sessions.engine.sandbox.backends import get_backend
from sessions.engine.sandbox.base import Sandbox, SandboxBackend, SandboxError, SandboxSpec
from sessions.engine.sandbox.local import LocalBackend, reap_orphans
from tests.sessions.drawing import connect_drawing

ROOT = Path(__file__).resolve().parents[2]

# --- helpers ---------------------------------------------------------------------------------


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(interval)


def processes_naming(path: str) -> list[psutil.Process]:
    """Live processes whose command line names ``path`` (zombies run nothing and are skipped)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
            continue
        if path in " ".join(proc.info["cmdline"] or ()):
            found.append(proc)
    return found


def gone(sandbox: Sandbox) -> bool:
    return not Path(sandbox.workdir).exists() and not processes_naming(sandbox.workdir)


def exited(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def run_key() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def refused_port() -> socket.socket:
    """A loopback port that is bound but never listens: connections to it are refused, and no
    other process can take it while the socket is open."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


def connect(playwright: Playwright, sandbox: Sandbox) -> Browser:
    return connect_drawing(playwright, sandbox.cdp_url, timeout=15_000)


def python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        proc.kill()
        raise AssertionError(f"no output from the child within {timeout} s")
    line = proc.stdout.readline()
    if not line:
        _, err = proc.communicate(timeout=5)
        raise AssertionError(f"the child ended without output: {err}")
    return line


class Served(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.seen: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class PortalHandler(BaseHTTPRequestHandler):
    server: Served

    def do_GET(self) -> None:
        self.server.seen.append(self.path)
        body = b"<!doctype html><title>Portal</title><h1>Acme portal</h1>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class ForwardProxyHandler(BaseHTTPRequestHandler):
    """A minimal forward proxy: absolute-form GET to loopback only, nothing else."""

    server: Served
    _HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length"})

    def do_GET(self) -> None:
        target = urlsplit(self.path)
        if target.scheme != "http" or target.hostname != "127.0.0.1":
            self.send_error(403)
            return
        self.server.seen.append(self.path)
        upstream = http.client.HTTPConnection("127.0.0.1", target.port or 80, timeout=10)
        path = (target.path or "/") + (f"?{target.query}" if target.query else "")
        upstream.request("GET", path, headers={"Host": target.netloc})
        response = upstream.getresponse()
        body = response.read()
        upstream.close()
        self.send_response(response.status)
        for name, value in response.getheaders():
            if name.lower() not in self._HOP:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_CONNECT(self) -> None:
        self.send_error(405)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[Served]:
    server = Served(handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture
def root(short_tmp: Path) -> Path:
    return short_tmp / "sandboxes"


@pytest.fixture(params=["off", "on"], ids=["plain", "namespaced"])
def mode(request: pytest.FixtureRequest) -> str:
    if request.param == "on" and not namespaces.probe().usable:
        pytest.skip(f"no namespaces on this host: {namespaces.probe().reason}")
    return str(request.param)


@pytest.fixture
def backend(root: Path, mode: str) -> LocalBackend:
    return LocalBackend(EngineConfig(sandbox_dir=root, local_namespaces=mode))


@pytest.fixture
def portal() -> Iterator[Served]:
    yield from serve(PortalHandler)


@pytest.fixture
def proxy() -> Iterator[Served]:
    yield from serve(ForwardProxyHandler)


@pytest.fixture
def make(backend: LocalBackend, proxy: Served) -> Iterator[Callable[..., Sandbox]]:
    """Create sandboxes through the test proxy; whatever a test leaves is destroyed after it."""
    made: list[Sandbox] = []

    def factory(**overrides: Any) -> Sandbox:
        spec_args: dict[str, Any] = {
            "run_key": run_key(),
            "proxy_url": proxy.url,
            "ttl_seconds": 120.0,
            **overrides,
        }
        sandbox = backend.create(SandboxSpec(**spec_args))
        made.append(sandbox)
        return sandbox

    yield factory
    for sandbox in made:
        backend.destroy(sandbox)


# --- the interface, without a browser --------------------------------------------------------


def test_it_refuses_run_keys_that_are_not_safe_as_directory_names() -> None:
    for bad in ("", "../x", "a/b", ".hidden", "a b", "x" * 129):
        with pytest.raises(ValueError, match="run_key"):
            SandboxSpec(run_key=bad, proxy_url="http://127.0.0.1:1", ttl_seconds=1)


def test_it_refuses_extra_flags_that_would_route_around_the_proxy() -> None:
    for flag in ("--proxy-server=direct://", "--no-proxy-server", "--proxy-bypass-list=*"):
        with pytest.raises(ValueError, match="override"):
            SandboxSpec(
                run_key="r", proxy_url="http://127.0.0.1:1", ttl_seconds=1, extra_args=(flag,)
            )
    with pytest.raises(ValueError, match="not a --flag"):
        SandboxSpec(
            run_key="r", proxy_url="http://127.0.0.1:1", ttl_seconds=1, extra_args=("evil.test",)
        )
    # Repeating exactly what the sandbox sets anyway is harmless.
    SandboxSpec(
        run_key="r",
        proxy_url="http://127.0.0.1:1",
        ttl_seconds=1,
        extra_args=("--proxy-server=http://127.0.0.1:1", "--lang=de"),
    )


def test_it_refuses_a_proxy_url_without_host_and_port() -> None:
    for bad in ("", "127.0.0.1:8080", "http://127.0.0.1", "ftp://127.0.0.1:21"):
        with pytest.raises(ValueError, match="proxy_url"):
            SandboxSpec(run_key="r", proxy_url=bad, ttl_seconds=1)


def test_a_sandbox_record_survives_a_trip_through_json() -> None:
    sandbox = Sandbox(
        backend="local",
        run_key="r1",
        cdp_url="http://127.0.0.1:9222",
        pid=10,
        pgid=10,
        workdir="/tmp/x/r1",
        started_at=1.5,
        deadline=2.5,
        ready_seconds=0.25,
        details={"isolation": "process"},
    )
    loaded = Sandbox.from_dict({**json.loads(json.dumps(sandbox.to_dict())), "future": 1})
    assert loaded == sandbox
    with pytest.raises(SandboxError, match="lacks pid"):
        Sandbox.from_dict({k: v for k, v in sandbox.to_dict().items() if k != "pid"})


def test_it_refuses_to_touch_a_sandbox_held_by_another_host(backend: LocalBackend) -> None:
    sandbox = Sandbox(
        backend="local",
        run_key="r1",
        cdp_url="http://127.0.0.1:9222",
        pid=1,
        pgid=1,
        workdir="/",
        started_at=0,
        deadline=0,
        ready_seconds=0,
        host="elsewhere.invalid",
    )
    for action in (backend.destroy, backend.alive, lambda s: backend.extend(s, 0)):
        with pytest.raises(SandboxError, match=r"elsewhere\.invalid"):
            action(sandbox)


def test_the_registry_knows_the_local_backend() -> None:
    config = EngineConfig(sandbox_dir=Path("/tmp/pandaweb-test-root"))
    local = get_backend("local", config)
    assert isinstance(local, LocalBackend)
    assert isinstance(local, SandboxBackend)
    assert local.root == Path("/tmp/pandaweb-test-root")
    with pytest.raises(SandboxError, match="unknown sandbox backend 'qemu'"):
        get_backend("qemu", config)


def test_a_member_caught_inside_exec_still_counts_as_the_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Inside execve() a process's command line reads empty for a moment; the group's only member
    # caught then must not make the sandbox look gone.
    workdir = str(tmp_path / "run1")
    member = subprocess.Popen(
        ["sh", "-c", "exec sleep 30", "sandbox", workdir], start_new_session=True
    )
    try:
        assert wait_for(lambda: _proc._cmdline(member.pid)[:1] == ["sleep"], 5)
        real = _proc._cmdline
        reads = iter([[], [], ["sh", "-c", "exec sleep 30", "sandbox", workdir]])
        monkeypatch.setattr(
            _proc, "_cmdline", lambda pid: next(reads) if pid == member.pid else real(pid)
        )
        assert group_alive(member.pid, workdir)
        monkeypatch.setattr(_proc, "_cmdline", real)
        assert not group_alive(member.pid, workdir)  # "sleep 30" does not name it
    finally:
        member.kill()
        member.wait()


def test_it_tells_run1_from_run10_in_command_lines() -> None:
    assert mentions(["chromium", "--user-data-dir=/s/run1/profile"], "/s/run1")
    assert mentions(["chromium --type=zygote --user-data-dir=/s/run1/profile --x"], "/s/run1")
    assert mentions(["python", "--workdir", "/s/run1"], "/s/run1")
    assert not mentions(["chromium", "--user-data-dir=/s/run10/profile"], "/s/run1")
    assert not mentions(["cat", "/s/run1x"], "/s/run1")


def test_it_never_removes_a_directory_that_is_not_a_sandbox(tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("x")
    assert remove_workdir(precious) is False
    assert (precious / "keep.txt").exists()
    (precious / MARKER).touch()
    assert remove_workdir(precious) is True
    assert not precious.exists()


def late_writes(monkeypatch: pytest.MonkeyPatch, workdir: Path, times: int) -> None:
    """The first ``times`` attempts to remove ``workdir`` find a file written after it was
    emptied, as a browser still dying (or a start still under way) writes one."""
    real_rmdir = Path.rmdir
    left = [times]

    def rmdir_after_a_late_write(path: Path) -> None:
        if path == workdir and left[0] > 0:
            left[0] -= 1
            (workdir / f"crash-report-{left[0]}").write_text("written while dying")
        real_rmdir(path)

    monkeypatch.setattr(Path, "rmdir", rmdir_after_a_late_write)
    monkeypatch.setattr("sessions.engine.sandbox._proc.REMOVE_PAUSE_SECONDS", 0)


def test_a_file_written_while_the_workdir_is_emptied_is_removed_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workdir = tmp_path / "run-1-abc"
    workdir.mkdir()
    (workdir / MARKER).touch()
    (workdir / "profile").mkdir()
    late_writes(monkeypatch, workdir, times=2)

    assert remove_workdir(workdir) is True
    assert not workdir.exists()


def test_a_workdir_still_written_keeps_its_marker_for_whoever_removes_it_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workdir = tmp_path / "run-1-abc"
    workdir.mkdir()
    (workdir / MARKER).touch()
    late_writes(monkeypatch, workdir, times=100)

    assert remove_workdir(workdir) is False
    assert (workdir / MARKER).is_file()
    monkeypatch.undo()
    assert remove_workdir(workdir) is True
    assert not workdir.exists()


# --- the local backend, with a real Chromium -------------------------------------------------


@pytest.mark.browser
def test_it_starts_a_browser_whose_cdp_answers_on_loopback_only(
    make: Callable[..., Sandbox], mode: str
) -> None:
    sandbox = make()
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with direct.open(f"{sandbox.cdp_url}/json/version", timeout=5) as response:
        version = json.loads(response.read())
    assert version["Browser"].startswith(("Chrome/", "HeadlessChrome/"))
    # Built from the Host header: the relay in front of a namespaced browser is invisible.
    assert version["webSocketDebuggerUrl"].startswith(sandbox.cdp_url.replace("http", "ws", 1))

    port = int(urlsplit(sandbox.cdp_url).port or 0)
    # The browser itself or (namespaced) the host end of its CDP relay, and nothing else.
    leader = psutil.Process(sandbox.pid)
    ours = {proc.pid for proc in (leader, *leader.children(recursive=True))}
    listening = [
        conn
        for conn in psutil.net_connections(kind="inet")
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port
    ]
    assert listening
    assert {conn.pid for conn in listening} <= ours
    assert {conn.laddr.ip for conn in listening if conn.laddr} == {"127.0.0.1"}

    workdir = Path(sandbox.workdir)
    assert stat.S_IMODE(workdir.stat().st_mode) == 0o700
    record = json.loads((workdir / "sandbox.json").read_text())
    assert Sandbox.from_dict(record) == sandbox
    assert sandbox.backend == "local"
    if mode == "off":
        assert sandbox.details["isolation"] == "process group only"
    else:
        assert sandbox.details["isolation"].endswith("network, mount, PID and IPC namespaces")
    assert "isolation_warning" not in sandbox.details
    assert sandbox.host == socket.gethostname()
    assert 0 < sandbox.ready_seconds < 15
    assert sandbox.deadline == pytest.approx(sandbox.started_at + 120)


@pytest.mark.browser
def test_it_sends_all_traffic_through_the_proxy_even_to_loopback(
    make: Callable[..., Sandbox],
    portal: Served,
    proxy: Served,
    playwright_instance: Playwright,
) -> None:
    sandbox = make()
    browser = connect(playwright_instance, sandbox)
    try:
        page = browser.contexts[0].new_page()
        page.goto(f"{portal.url}/invoices", timeout=15_000)
        assert page.title() == "Portal"
    finally:
        browser.close()
    assert f"{portal.url}/invoices" in proxy.seen


@pytest.mark.browser
def test_it_loads_nothing_without_a_working_proxy(
    backend: LocalBackend, portal: Served, playwright_instance: Playwright, mode: str
) -> None:
    with refused_port() as dead:
        sandbox = backend.create(
            SandboxSpec(
                run_key=run_key(),
                proxy_url=f"http://127.0.0.1:{dead.getsockname()[1]}",
                ttl_seconds=60,
            )
        )
        try:
            browser = connect(playwright_instance, sandbox)
            try:
                page = browser.contexts[0].new_page()
                # In namespaces the browser's proxy is a relay that accepts the connection and
                # only then finds the real proxy gone: the browser sees it closed, early or late.
                failed = (
                    "ERR_PROXY_CONNECTION_FAILED"
                    if mode == "off"
                    else "ERR_SOCKET_NOT_CONNECTED|ERR_EMPTY_RESPONSE"
                )
                with pytest.raises(PlaywrightError, match=failed):
                    page.goto(portal.url, timeout=15_000)
            finally:
                browser.close()
        finally:
            backend.destroy(sandbox)
    assert portal.seen == []


@pytest.mark.browser
def test_it_keeps_two_sandboxes_apart(
    make: Callable[..., Sandbox], portal: Served, playwright_instance: Playwright
) -> None:
    first, second = make(), make()
    assert first.workdir != second.workdir
    assert first.cdp_url != second.cdp_url
    assert first.pgid != second.pgid

    browser = connect(playwright_instance, first)
    try:
        page = browser.contexts[0].new_page()
        page.goto(portal.url)
        page.evaluate("document.cookie = 'session=first; path=/'")
        page.evaluate("localStorage.setItem('who', 'first')")
        assert "session=first" in page.evaluate("document.cookie")
    finally:
        browser.close()

    browser = connect(playwright_instance, second)
    try:
        page = browser.contexts[0].new_page()
        page.goto(portal.url)
        assert page.evaluate("document.cookie") == ""
        assert page.evaluate("localStorage.getItem('who')") is None
        assert browser.contexts[0].cookies() == []
    finally:
        browser.close()


@pytest.mark.browser
def test_destroy_leaves_no_process_and_no_workdir_and_may_be_repeated(
    backend: LocalBackend, make: Callable[..., Sandbox]
) -> None:
    sandbox = make()
    assert backend.alive(sandbox)
    assert processes_naming(sandbox.workdir)  # the browser and its watchdog

    backend.destroy(sandbox)

    assert gone(sandbox)
    assert not backend.alive(sandbox)
    backend.destroy(sandbox)
    with pytest.raises(SandboxError, match="is gone"):
        backend.extend(sandbox, time.time() + 60)


@pytest.mark.browser
def test_it_destroys_a_sandbox_from_another_process(
    backend: LocalBackend, make: Callable[..., Sandbox]
) -> None:
    sandbox = make()
    child = python(
        "import json, sys\n"
        "from sessions.engine.config import EngineConfig\n"
        "from sessions.engine.sandbox.backends import get_backend\n"
        "from sessions.engine.sandbox.base import Sandbox\n"
        "backend = get_backend('local', EngineConfig())\n"
        "backend.destroy(Sandbox.from_dict(json.loads(sys.argv[1])))\n",
        json.dumps(sandbox.to_dict()),
    )
    _, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert wait_for(lambda: gone(sandbox), 5)
    assert not backend.alive(sandbox)


@pytest.mark.browser
def test_it_kills_the_browser_at_the_deadline_even_if_the_creator_was_killed(
    root: Path, proxy: Served, mode: str
) -> None:
    # The TTL counts from the start of create(); on a loaded 2-core machine start-up alone can
    # take a couple of seconds, hence 4 s rather than less.
    creator = python(
        "import json, sys, time\n"
        "from pathlib import Path\n"
        "from sessions.engine.config import EngineConfig\n"
        "from sessions.engine.sandbox.base import SandboxSpec\n"
        "from sessions.engine.sandbox.local import LocalBackend\n"
        "config = EngineConfig(sandbox_dir=Path(sys.argv[1]), local_namespaces=sys.argv[4])\n"
        "spec = SandboxSpec(run_key=sys.argv[2], proxy_url=sys.argv[3], ttl_seconds=4.0)\n"
        "sandbox = LocalBackend(config).create(spec)\n"
        "print(json.dumps(sandbox.to_dict()), flush=True)\n"
        "time.sleep(600)\n",
        str(root),
        run_key(),
        proxy.url,
        mode,
    )
    try:
        sandbox = Sandbox.from_dict(json.loads(read_line(creator, timeout=60)))
    finally:
        creator.send_signal(signal.SIGKILL)
        creator.communicate(timeout=10)
    backend = LocalBackend(EngineConfig(sandbox_dir=root))
    watchdog = psutil.Process(sandbox.details["watchdog_pid"])
    if time.time() < sandbox.deadline - 0.5:
        assert backend.alive(sandbox)

    assert wait_for(lambda: gone(sandbox), timeout=sandbox.deadline - time.time() + 6)
    assert time.time() >= sandbox.deadline
    assert not backend.alive(sandbox)
    assert exited(watchdog)


@pytest.mark.browser
def test_extend_pushes_the_kill_back(backend: LocalBackend, make: Callable[..., Sandbox]) -> None:
    sandbox = make()
    # Deadlines are set relative to now, after start-up, so a slow start cannot eat into them.
    backend.extend(sandbox, time.time() + 2)
    backend.extend(sandbox, time.time() + 4)
    first_deadline_passed = time.time() + 2.5
    assert sandbox.deadline == pytest.approx(time.time() + 4, abs=1)
    record = json.loads((Path(sandbox.workdir) / "sandbox.json").read_text())
    assert record["deadline"] == sandbox.deadline

    assert not wait_for(lambda: not backend.alive(sandbox), first_deadline_passed - time.time())
    assert wait_for(lambda: gone(sandbox), timeout=sandbox.deadline - time.time() + 6)
    assert time.time() >= sandbox.deadline


@pytest.mark.browser
def test_a_failed_start_raises_a_readable_error_and_leaves_nothing(root: Path, mode: str) -> None:
    config = EngineConfig(sandbox_dir=root, local_namespaces=mode, chromium="/bin/false")
    with pytest.raises(SandboxError, match="Chromium exited with status 1"):
        LocalBackend(config).create(
            SandboxSpec(run_key=run_key(), proxy_url="http://127.0.0.1:1", ttl_seconds=60)
        )
    assert list(root.iterdir()) == []
    assert wait_for(lambda: not processes_naming(str(root)), 5)

    config = dataclasses.replace(config, chromium="/nonexistent/chromium")
    with pytest.raises(SandboxError, match="not an executable file"):
        LocalBackend(config).create(
            SandboxSpec(run_key=run_key(), proxy_url="http://127.0.0.1:1", ttl_seconds=60)
        )


@pytest.mark.browser
def test_it_refuses_a_run_key_already_in_use(
    backend: LocalBackend, make: Callable[..., Sandbox], proxy: Served
) -> None:
    sandbox = make()
    with pytest.raises(SandboxError, match="already exists"):
        backend.create(SandboxSpec(run_key=sandbox.run_key, proxy_url=proxy.url, ttl_seconds=60))
    assert backend.alive(sandbox)


@pytest.mark.browser
def test_reap_orphans_destroys_expired_sandboxes_whose_watchdog_died(
    backend: LocalBackend, make: Callable[..., Sandbox], root: Path
) -> None:
    orphan, healthy = make(), make()
    watchdog = psutil.Process(orphan.details["watchdog_pid"])
    assert mentions(watchdog.cmdline(), orphan.workdir)
    watchdog.kill()
    assert wait_for(lambda: exited(watchdog), 5)
    # With its watchdog gone, nothing but the reaper will act on the expired deadline.
    (Path(orphan.workdir) / "deadline").write_text(repr(time.time() - 1))

    assert reap_orphans(root) == [orphan.run_key]

    assert gone(orphan)
    assert backend.alive(healthy)
    assert reap_orphans(root) == []


@pytest.mark.browser
def test_the_watchdog_outlives_a_group_kill_and_then_leaves_on_its_own(
    backend: LocalBackend, make: Callable[..., Sandbox]
) -> None:
    sandbox = make()
    watchdog = psutil.Process(sandbox.details["watchdog_pid"])
    os.killpg(sandbox.pgid, signal.SIGKILL)

    assert wait_for(lambda: exited(watchdog), 10)
    log = (Path(sandbox.workdir) / "watchdog.log").read_text()
    assert "browser gone" in log  # it noticed, rather than dying with the group
    assert not backend.alive(sandbox)
    backend.destroy(sandbox)
    assert gone(sandbox)
