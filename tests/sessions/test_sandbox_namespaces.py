"""What namespaces add to the local backend: the kernel, not a browser flag, keeps the browser
from reaching anything but its proxy; it has its own /tmp, mounts and processes.

Every network check sends packets to 127.0.0.0/8 only. Connections and look-ups made from inside
a sandbox first make sure its namespace has nothing but a loopback interface.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Playwright

from sessions.engine.chromium import MANAGED_POLICY, MANAGED_POLICY_NAME
from sessions.engine.config import EngineConfig
from sessions.engine.sandbox import cdp_gate, namespaces
from sessions.engine.sandbox.base import Sandbox, SandboxError, SandboxSpec
from sessions.engine.sandbox.local import LocalBackend
from sessions.engine.sandbox.workdirs import json_version
from tests.sessions.drawing import connect_drawing
from tests.sessions.test_sandbox import (
    ForwardProxyHandler,
    PortalHandler,
    Served,
    connect,
    exited,
    gone,
    processes_naming,
    run_key,
    serve,
    wait_for,
)

SUPPORT = namespaces.probe()
CDP_GATE = cdp_gate.__file__
needs_namespaces = pytest.mark.skipif(
    not SUPPORT.usable, reason=f"no namespaces on this host: {SUPPORT.reason}"
)
USER_NAMESPACES = SUPPORT.usable and (
    subprocess.run(
        [SUPPORT.tool("unshare"), "--user", "--map-root-user", "--net", "true"],
        capture_output=True,
    ).returncode
    == 0
)

# Run by the sandbox's own network namespace (nsenter); prints what it could reach.
INSIDE = r"""
import json, socket, sys
found = {"interfaces": sorted(name for _, name in socket.if_nameindex())}
# Anything but a lone loopback means we are not where we think: then try nothing at all.
if found["interfaces"] == ["lo"]:
    for target in sys.argv[1:]:
        host, port = target.rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            found[target] = "connected"
        except OSError as exc:
            found[target] = type(exc).__name__
    try:
        socket.getaddrinfo("example.com", 80)
        found["dns"] = "resolved"
    except OSError as exc:
        found["dns"] = type(exc).__name__
print(json.dumps(found))
"""


class Sink:
    """A loopback listener that counts the connections that reach it."""

    def __init__(self, host: str) -> None:
        self.sock = socket.create_server((host, 0))
        self.address = f"{host}:{self.sock.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self.connections += 1
                conn.close()


class InvoiceHandler(PortalHandler):
    def do_GET(self) -> None:
        if self.path != "/invoice.csv":
            body = b"<!doctype html><title>Invoices</title><a href='/invoice.csv'>INV-1</a>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
        else:
            body = b"number,amount\nINV-1,12.50\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/csv")
            self.send_header("Content-Disposition", "attachment; filename=invoice.csv")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def browser_process(sandbox: Sandbox) -> psutil.Process:
    """Chromium's browser process (not one of its helpers, not the relays)."""
    for proc in psutil.Process(sandbox.pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            cmdline = proc.cmdline()
            if (
                cmdline
                and Path(cmdline[0]).name in ("chromium", "chromium-headless-shell")
                and not any(arg.startswith("--type=") for arg in cmdline)
            ):
                return proc
    raise AssertionError(f"no browser process under {sandbox.pid}")


def inside(sandbox: Sandbox, path: str) -> Path:
    """``path`` as the sandbox's browser sees it, through its mount namespace."""
    return Path(f"/proc/{browser_process(sandbox).pid}/root{path}")


def nspids(pid: int) -> list[int]:
    """A process's pid in each PID namespace it belongs to, the host's first."""
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("NSpid:"))
    return [int(field) for field in line.split()[1:]]


def relays(sandbox: Sandbox) -> list[psutil.Process]:
    found = []
    for proc in processes_naming(sandbox.workdir):
        # One a connection forked may be gone by now.
        with contextlib.suppress(psutil.NoSuchProcess):
            if proc.name() == "socat" or CDP_GATE in proc.cmdline():
                found.append(proc)
    return found


def ask(port: int, target: str, *, upgrade: bool = False) -> bytes:
    """Everything a raw HTTP request for ``target`` gets back from ``127.0.0.1:port``."""
    upgrade_headers = (
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        if upgrade
        else ""
    )
    request = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{upgrade_headers}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(request.encode())
        answer = b""
        with contextlib.suppress(TimeoutError):
            while chunk := conn.recv(65536):
                answer += chunk
    return answer


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture
def root(short_tmp: Path) -> Path:
    return short_tmp / "sandboxes"


@pytest.fixture
def portal() -> Iterator[Served]:
    yield from serve(InvoiceHandler)


@pytest.fixture
def proxy() -> Iterator[Served]:
    yield from serve(ForwardProxyHandler)


@pytest.fixture
def make(root: Path, proxy: Served) -> Iterator[Callable[..., Sandbox]]:
    """Create sandboxes through the test proxy; whatever a test leaves is destroyed after it."""
    made: list[tuple[LocalBackend, Sandbox]] = []

    def factory(mode: str = "on") -> Sandbox:
        backend = LocalBackend(EngineConfig(sandbox_dir=root, local_namespaces=mode))
        sandbox = backend.create(
            SandboxSpec(run_key=run_key(), proxy_url=proxy.url, ttl_seconds=120)
        )
        made.append((backend, sandbox))
        return sandbox

    yield factory
    for backend, sandbox in made:
        backend.destroy(sandbox)


# --- the browser's way out -------------------------------------------------------------------


@needs_namespaces
@pytest.mark.browser
def test_it_loads_an_allowed_page_through_the_proxy(
    make: Callable[..., Sandbox],
    portal: Served,
    proxy: Served,
    playwright_instance: Playwright,
) -> None:
    sandbox = make()
    assert sandbox.details["isolation"] == SUPPORT.isolation
    assert "isolation_warning" not in sandbox.details

    browser = connect(playwright_instance, sandbox)
    try:
        page = browser.contexts[0].new_page()
        page.goto(f"{portal.url}/invoices", timeout=15_000)
        assert page.title() == "Invoices"
    finally:
        browser.close()
    assert f"{portal.url}/invoices" in proxy.seen


@needs_namespaces
@pytest.mark.browser
def test_nothing_but_the_proxy_is_reachable_from_its_network_namespace(
    make: Callable[..., Sandbox],
) -> None:
    sandbox = make()
    sinks = [Sink("127.0.0.1"), Sink("127.0.0.2")]
    proxy_inside = f"127.0.0.1:{namespaces.INNER_PROXY_PORT}"
    done = subprocess.run(
        [
            "nsenter",
            f"--net=/proc/{browser_process(sandbox).pid}/ns/net",
            "--",
            sys.executable,
            "-S",
            "-c",
            INSIDE,
            proxy_inside,
            *(sink.address for sink in sinks),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)

    assert found["interfaces"] == ["lo"]
    assert found[proxy_inside] == "connected"
    for sink in sinks:
        assert found[sink.address] == "ConnectionRefusedError"
        assert sink.connections == 0
    assert found["dns"] == "gaierror"

    # The sinks do count what reaches them.
    for sink in sinks:
        host, port = sink.address.split(":")
        socket.create_connection((host, int(port)), timeout=2).close()
    assert wait_for(lambda: all(sink.connections == 1 for sink in sinks), 5)


@pytest.mark.browser
@pytest.mark.parametrize(
    "mode", ["off", pytest.param("on", marks=needs_namespaces)], ids=["plain", "namespaced"]
)
def test_a_page_whose_proxy_was_switched_off_reaches_nothing_in_namespaces(
    make: Callable[..., Sandbox], playwright_instance: Playwright, mode: str
) -> None:
    # Whoever holds CDP can open a browser context without the proxy: only the kernel stops
    # that. The plain sandbox is the control, showing the sink would count a leak.
    sandbox = make(mode)
    sink = Sink("127.0.0.2")
    browser = connect(playwright_instance, sandbox)
    try:
        cdp = browser.new_browser_cdp_session()
        context = cdp.send("Target.createBrowserContext", {"proxyServer": "direct://"})
        cdp.send(
            "Target.createTarget",
            {"url": f"http://{sink.address}/", "browserContextId": context["browserContextId"]},
        )
        reached = wait_for(lambda: sink.connections > 0, 5)
    finally:
        browser.close()
    if mode == "off":
        assert reached
    else:
        assert not reached
        assert sink.connections == 0


# --- files and processes ---------------------------------------------------------------------


@needs_namespaces
@pytest.mark.browser
def test_its_tmp_is_its_own_and_downloads_go_through_the_workdir(
    make: Callable[..., Sandbox], portal: Served, playwright_instance: Playwright, tmp_path: Path
) -> None:
    sandbox = make()

    # Playwright's default: the browser writes the download under the driver's /tmp, and that
    # path is the sandbox's private /tmp, not the host's.
    browser = connect(playwright_instance, sandbox)
    try:
        page = browser.contexts[0].new_page()
        page.goto(portal.url)
        with page.expect_download() as info:
            page.get_by_role("link", name="INV-1").click()
        download = info.value
        assert download.failure() is None
        written = download.path()
        with pytest.raises(PlaywrightError, match="ENOENT"):
            download.save_as(tmp_path / "lost.csv")
    finally:
        browser.close()
    assert str(written).startswith("/tmp/")
    assert not written.exists()
    assert inside(sandbox, str(written)).read_text() == "number,amount\nINV-1,12.50\n"

    # With the artifacts_dir the sandbox names, it reaches the host.
    browser = connect_drawing(
        playwright_instance, sandbox.cdp_url, artifacts_dir=sandbox.details["artifacts_dir"]
    )
    try:
        page = browser.contexts[0].new_page()
        page.goto(portal.url)
        with page.expect_download() as info:
            page.get_by_role("link", name="INV-1").click()
        info.value.save_as(tmp_path / "invoice.csv")
    finally:
        browser.close()
    assert (tmp_path / "invoice.csv").read_text() == "number,amount\nINV-1,12.50\n"

    # Nor does the host's /tmp, /dev/shm or /run show through.
    with tempfile.NamedTemporaryFile(dir="/tmp", prefix="pandaweb-host-") as host_file:
        assert not inside(sandbox, host_file.name).exists()
    assert not set(os.listdir(inside(sandbox, "/dev/shm"))) & set(os.listdir("/dev/shm"))
    assert not set(os.listdir(inside(sandbox, "/run"))) & set(os.listdir("/run")) - {"mount"}


@needs_namespaces
@pytest.mark.browser
def test_it_holds_pandawebs_managed_policy_which_the_host_does_not_get(
    make: Callable[..., Sandbox],
) -> None:
    # Read by the desktop Chromium (the headless shell reads no policy: its switches are what
    # keeps its own traffic off).
    sandbox = make()
    policy = f"/etc/chromium/policies/managed/{MANAGED_POLICY_NAME}"

    assert json.loads(inside(sandbox, policy).read_text()) == MANAGED_POLICY
    # Chromium's other configuration is still the host's...
    for name in os.listdir("/etc/chromium"):
        assert inside(sandbox, f"/etc/chromium/{name}").exists()
    # ...the host gets no policy from a sandbox, and the browser cannot change its own.
    assert not Path(policy).exists()
    with open(f"/proc/{browser_process(sandbox).pid}/mountinfo") as mounts:
        [line] = [m for m in mounts if m.split()[4] == "/etc/chromium"]
    assert line.split()[5].split(",")[0] == "ro"


@needs_namespaces
@pytest.mark.browser
def test_it_sees_its_own_workdir_but_no_other_sandbox(make: Callable[..., Sandbox]) -> None:
    first, second = make(), make()
    assert inside(first, first.workdir + "/cdp.sock").exists()
    assert inside(first, first.workdir + "/proxy.sock").exists()
    assert not inside(first, second.workdir).exists()
    assert os.listdir(inside(first, str(Path(first.workdir).parent))) == [first.run_key]
    # Its profile is a tmpfs of its own: the host's directory stays empty.
    assert inside(first, first.workdir + "/profile/Default").is_dir()
    assert os.listdir(Path(first.workdir) / "profile") == []


@needs_namespaces
@pytest.mark.browser
def test_it_sees_only_its_own_processes(make: Callable[..., Sandbox]) -> None:
    sandbox = make()
    browser = browser_process(sandbox)
    host_pid, own_pid = nspids(browser.pid)
    assert host_pid == browser.pid
    assert own_pid < 100

    proc = inside(sandbox, "/proc")
    pids = [int(name) for name in os.listdir(proc) if name.isdigit()]
    assert 1 in pids
    assert len(pids) < 100
    init = (proc / "1" / "cmdline").read_bytes().split(b"\0")
    assert sandbox.workdir.encode() in init
    me = Path("/proc/self/cmdline").read_bytes()
    for pid in pids:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            assert (proc / str(pid) / "cmdline").read_bytes() != me


@pytest.mark.browser
@pytest.mark.parametrize("user", [False, True], ids=["root", "user-namespace"])
def test_the_browser_holds_no_capability_with_or_without_a_user_namespace(
    make: Callable[..., Sandbox],
    portal: Served,
    playwright_instance: Playwright,
    monkeypatch: pytest.MonkeyPatch,
    user: bool,
) -> None:
    # Root makes its namespaces without a user namespace, everyone else inside one: both ways
    # are tried here, whichever this host's probe chose.
    if not SUPPORT.usable:
        pytest.skip(f"no namespaces on this host: {SUPPORT.reason}")
    if not user and os.geteuid() != 0:
        pytest.skip("only root makes namespaces without a user namespace")
    if user and not USER_NAMESPACES:
        pytest.skip("no user namespaces on this host")
    monkeypatch.setattr(
        namespaces, "probe", lambda: namespaces.Support(usable=True, user=user, tools=SUPPORT.tools)
    )
    sandbox = make()
    expected = "network, mount, PID and IPC namespaces"
    assert sandbox.details["isolation"] == (f"user, {expected}" if user else expected)

    browser = browser_process(sandbox)
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{browser.pid}/status").read_text().splitlines()
    )
    for field in ("CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[field], 16) == 0, field
    assert status["NoNewPrivs"].strip() == "1"
    assert os.readlink(f"/proc/{browser.pid}/ns/net") != os.readlink("/proc/self/ns/net")
    if user:
        # Root inside, this process's own user outside.
        assert os.readlink(f"/proc/{browser.pid}/ns/user") != os.readlink("/proc/self/ns/user")
        uid_map = Path(f"/proc/{browser.pid}/uid_map").read_text().split()
        assert uid_map == ["0", str(os.geteuid()), "1"]
    else:
        assert os.readlink(f"/proc/{browser.pid}/ns/user") == os.readlink("/proc/self/ns/user")

    cdp = connect(playwright_instance, sandbox)
    try:
        page = cdp.contexts[0].new_page()
        page.goto(portal.url, timeout=15_000)
        assert page.title() == "Invoices"
    finally:
        cdp.close()


# --- who may drive the browser ---------------------------------------------------------------


@needs_namespaces
@pytest.mark.browser
def test_its_browser_answers_only_a_client_holding_the_runs_secret(
    make: Callable[..., Sandbox], portal: Served, playwright_instance: Playwright
) -> None:
    """While a run waits for approval its browser is logged in to the portal: another process on
    the host must not be able to drive it past the approval gate."""
    sandbox = make()
    address = urlsplit(sandbox.cdp_url)
    assert address.hostname == "127.0.0.1"
    assert address.port is not None
    secret = address.path.strip("/")
    assert len(secret) >= 40

    # The run's own workers: the address with its secret drives the browser.
    browser = connect(playwright_instance, sandbox)
    try:
        page = browser.contexts[0].new_page()
        page.goto(f"{portal.url}/invoices", timeout=15_000)
        assert page.title() == "Invoices"
    finally:
        browser.close()
    version = json_version(sandbox.cdp_url, timeout=5)
    assert version is not None
    browser_path = urlsplit(version["webSocketDebuggerUrl"]).path
    assert browser_path.startswith(f"/{secret}/devtools/browser/")

    # Anyone else on the host: the same port without the secret, with a near miss, or straight
    # at the browser's websocket, gets a 403 and not a word about the browser.
    port = address.port
    bare_browser = browser_path.removeprefix(f"/{secret}")
    for target, upgrade in [
        ("/json/version", False),
        ("/json/list", False),
        (f"/{secret[:-1]}/json/version", False),
        (f"/{secret}x/json/version", False),
        (f"/{secret.swapcase()}/json/version", False),
        (bare_browser, True),
        (f"/x{bare_browser}", True),
    ]:
        answer = ask(port, target, upgrade=upgrade)
        assert answer.startswith(b"HTTP/1.1 403 "), (target, answer[:200])
        assert b"devtools" not in answer, target
        assert b"Chrome" not in answer, target
    with pytest.raises(PlaywrightError):
        playwright_instance.chromium.connect_over_cdp(f"http://127.0.0.1:{port}", timeout=5_000)

    # The browser itself listens on no host port, and the secret is on no command line.
    sandbox_pids = {proc.pid for proc in processes_naming(sandbox.workdir)}
    listening = {
        conn.pid
        for conn in psutil.net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN and conn.pid in sandbox_pids
    }
    assert [CDP_GATE in psutil.Process(pid).cmdline() for pid in listening] == [True]
    for proc in processes_naming(sandbox.workdir):
        with contextlib.suppress(psutil.NoSuchProcess):
            assert not any(secret in arg for arg in proc.cmdline())
    assert os.stat(Path(sandbox.workdir) / cdp_gate.SECRET_FILE).st_mode & 0o077 == 0


# --- nothing left behind ---------------------------------------------------------------------


@needs_namespaces
@pytest.mark.browser
def test_destroy_stops_the_relays_too(make: Callable[..., Sandbox], root: Path) -> None:
    sandbox = make()
    assert len(relays(sandbox)) >= 4  # two on the host, two inside, and their connections
    started = time.monotonic()
    LocalBackend(EngineConfig(sandbox_dir=root)).destroy(sandbox)
    assert time.monotonic() - started < 1  # no grace period spent on a polite stop
    assert gone(sandbox)


@needs_namespaces
@pytest.mark.browser
@pytest.mark.parametrize("victim", ["browser", "namespace init"])
def test_when_the_browser_or_its_init_dies_the_whole_sandbox_goes(
    make: Callable[..., Sandbox], root: Path, victim: str
) -> None:
    sandbox = make()
    watchdog = psutil.Process(sandbox.details["watchdog_pid"])
    browser = browser_process(sandbox)
    target = browser if victim == "browser" else psutil.Process(browser.ppid())
    if victim == "namespace init":
        assert nspids(target.pid)[-1] == 1
    target.send_signal(signal.SIGKILL)

    assert wait_for(lambda: exited(watchdog), 10)
    assert "browser gone" in (Path(sandbox.workdir) / "watchdog.log").read_text()
    assert wait_for(lambda: not processes_naming(sandbox.workdir), 5)
    backend = LocalBackend(EngineConfig(sandbox_dir=root))
    assert not backend.alive(sandbox)
    backend.destroy(sandbox)
    assert gone(sandbox)


# --- when namespaces cannot be had -----------------------------------------------------------


def unavailable() -> namespaces.Support:
    return namespaces.Support(
        usable=False, reason="not root and user namespaces are unavailable (test)"
    )


@pytest.mark.browser
def test_auto_falls_back_to_a_process_group_and_says_why(
    make: Callable[..., Sandbox],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(namespaces, "probe", unavailable)
    with caplog.at_level(logging.WARNING, logger="sessions.engine.sandbox.local"):
        sandbox = make("auto")
    assert sandbox.details["isolation"] == "process group only"
    assert sandbox.details["isolation_warning"] == (
        "not root and user namespaces are unavailable (test): "
        "the browser's egress is enforced by its proxy flag only, and its debugging port is "
        "open to every process on this host"
    )
    assert sandbox.run_key in caplog.text
    assert "proxy flag only" in caplog.text
    assert not relays(sandbox)


@pytest.mark.browser
def test_off_means_a_process_group_without_a_warning(make: Callable[..., Sandbox]) -> None:
    sandbox = make("off")
    assert sandbox.details["isolation"] == "process group only"
    assert "isolation_warning" not in sandbox.details


def test_on_refuses_to_start_without_namespaces(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(namespaces, "probe", unavailable)
    spec = SandboxSpec(run_key=run_key(), proxy_url="http://127.0.0.1:1", ttl_seconds=60)
    with pytest.raises(SandboxError, match="user namespaces are unavailable"):
        LocalBackend(EngineConfig(sandbox_dir=root, local_namespaces="on")).create(spec)
    assert list(root.iterdir()) == []


@needs_namespaces
def test_on_refuses_a_sandbox_root_the_relays_cannot_name(tmp_path: Path) -> None:
    root = tmp_path / "a,b"
    spec = SandboxSpec(run_key=run_key(), proxy_url="http://127.0.0.1:1", ttl_seconds=60)
    with pytest.raises(SandboxError, match="characters"):
        LocalBackend(EngineConfig(sandbox_dir=root, local_namespaces="on")).create(spec)
    assert list(root.iterdir()) == []


def test_the_mode_comes_from_the_engine_config() -> None:
    assert LocalBackend(EngineConfig(local_namespaces="off")).namespaces == "off"
    assert LocalBackend(EngineConfig()).namespaces == "auto"
    with pytest.raises(ValueError, match="local_namespaces must be one of auto, on, off"):
        EngineConfig(local_namespaces="sometimes")


def test_the_probe_tries_the_real_set_up_once() -> None:
    first = namespaces.probe()
    assert namespaces.probe() is first
    if first.usable:
        assert {name for name, _ in first.tools} == {"unshare", "mount", "ip", "socat", "setpriv"}
    else:
        assert first.reason


@needs_namespaces
def test_on_refuses_a_sandbox_root_too_long_for_the_sockets_inside_it(tmp_path: Path) -> None:
    root = tmp_path / ("deep" * 20)
    spec = SandboxSpec(run_key=run_key(), proxy_url="http://127.0.0.1:1", ttl_seconds=60)
    with pytest.raises(SandboxError, match="set PANDAWEB_SANDBOX_DIR to a shorter path"):
        LocalBackend(EngineConfig(sandbox_dir=root, local_namespaces="on")).create(spec)
    assert list(root.iterdir()) == []
