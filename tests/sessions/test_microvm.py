"""The microVM backend for real: QEMU ``-M microvm`` with the project's guest image, under KVM
where the host has hardware virtualization and under TCG (software emulation) elsewhere, such as
on the CI machine. Slow (a page load takes ~20 s under TCG): CI runs this group once, after
building the guest image with ``manage.py microvm_image``."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import pytest
import yaml
from django.conf import settings
from django.contrib.auth.models import User
from playwright.sync_api import Error as PlaywrightError

from pandaweb.demo_portal.server import PortalServer, make_server
from sessions import services
from sessions.engine.config import EngineConfig
from sessions.engine.egress_policy import EgressPolicy
from sessions.engine.proxy import EgressProxy
from sessions.engine.sandbox import cdp_gate
from sessions.engine.sandbox.base import Sandbox, SandboxSpec
from sessions.engine.sandbox.microvm.backend import MicroVMBackend
from sessions.engine.sandbox.microvm.image import GuestImage, find_image
from sessions.engine.sandbox.workdirs import json_version
from sessions.engine.screencast import MASK_COLOUR, BrowserTap, Frame
from sessions.models import Run
from sessions.services import execution
from tests.sessions.conftest import EXAMPLE, publish
from tests.sessions.drawing import connect_drawing
from workflows.models import Credential

# Under software emulation a VM's pages take tens of seconds, and several times that when the
# host is short of CPU (steal time of 5-27% measured on the shared CI machine): a test is given
# minutes, not seconds. How fast a VM starts is measured by bench/isolation.py, not here.
pytestmark = [
    pytest.mark.microvm,
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.timeout(900),
]


@pytest.fixture(scope="module")
def guest_image() -> GuestImage:
    image = find_image(settings.ENGINE_CONFIG.microvm_image_dir)
    # Not a skip: CI builds the image before this group, so a missing one is a failure to see.
    assert image is not None, "no guest image: run `python manage.py microvm_image` first"
    return image


@pytest.fixture(scope="module")
def portal_server() -> Iterator[PortalServer]:
    """One portal for the module: the two session-template tests fork one baked VM, and a bake
    (a log-in under TCG) costs minutes."""
    server = make_server("127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture(scope="module")
def portal(portal_server: PortalServer) -> str:
    return f"http://127.0.0.1:{portal_server.server_port}"


@pytest.fixture
def sandbox_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("microvms")
    root.chmod(0o700)
    return root


def microvm_config(sandbox_root: Path, **fields: Any) -> EngineConfig:
    """The settings' microVM configuration (image directory, accelerator, memory: what the
    operator running the group set), with the test's own sandbox root."""
    return replace(settings.ENGINE_CONFIG, sandbox_dir=sandbox_root, **fields)


@pytest.fixture
def backend(guest_image: GuestImage, sandbox_root: Path) -> MicroVMBackend:
    return MicroVMBackend(microvm_config(sandbox_root))


@pytest.fixture
def proxy(portal: str) -> Iterator[EgressProxy]:
    proxy = EgressProxy(EgressPolicy([portal.removeprefix("http://")]), on_denied=lambda _: None)
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.fixture
def vm(backend: MicroVMBackend, proxy: EgressProxy) -> Iterator[Sandbox]:
    sandbox = backend.create(SandboxSpec(run_key="vm-test", proxy_url=proxy.url, ttl_seconds=600))
    yield sandbox
    backend.destroy(sandbox)


def qemu_processes(workdir: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            line = " ".join(process.info["cmdline"] or [])
        except psutil.NoSuchProcess:
            continue
        if "qemu-system" in line and workdir in line:
            found.append(process)
    return found


def test_it_prints_the_accelerator_it_uses(backend: MicroVMBackend) -> None:
    accelerator = backend.accelerator
    # CI shows which accelerator the microVM tests ran under (-s or -rA prints this).
    print(f"\nmicroVM accelerator: {accelerator.label}: {accelerator.reason}")
    assert accelerator.name in {"kvm", "tcg"}
    assert bool(accelerator.warning) == (accelerator.name == "tcg")


def test_a_vm_restored_from_the_base_snapshot_is_ready_quickly_with_the_hosts_clock(
    vm: Sandbox, backend: MicroVMBackend
) -> None:
    assert vm.details["start"] == "snapshot restore"
    assert vm.details["accelerator"] == backend.accelerator.label
    # Only that it started in a bounded time: the benchmark measures how fast.
    assert vm.ready_seconds < 120
    assert qemu_processes(vm.workdir)

    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = connect_drawing(playwright, vm.cdp_url, timeout=120_000)
        page = browser.contexts[0].pages[0]
        guest_now = page.evaluate("Date.now()") / 1000
        browser.close()
    # The base state was saved minutes or days ago: without the push the guest would live then.
    assert abs(guest_now - time.time()) < 5


def test_the_vms_browser_answers_only_a_client_holding_the_runs_secret(vm: Sandbox) -> None:
    """QEMU's CDP forward listens in QEMU's own network namespace; on the host there is only
    the gate, which forwards nothing without the run's secret."""
    address = urlsplit(vm.cdp_url)
    secret = address.path.strip("/")
    assert len(secret) >= 40
    assert json_version(vm.cdp_url, timeout=30) is not None
    assert address.port is not None
    for target in ("/json/version", f"/{secret[:-1]}/json/version"):
        with socket.create_connection(("127.0.0.1", address.port), timeout=10) as conn:
            conn.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            answer = conn.recv(65536)
        assert answer.startswith(b"HTTP/1.1 403 "), answer[:200]
    # QEMU's forwards (the CDP and clock ports it was given) are on no host port.
    host_listeners = {
        conn.laddr[1]
        for conn in psutil.net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN and conn.laddr
    }
    assert vm.details["control_port"] not in host_listeners


def test_destroy_leaves_no_qemu_behind(backend: MicroVMBackend, proxy: EgressProxy) -> None:
    sandbox = backend.create(SandboxSpec(run_key="vm-gone", proxy_url=proxy.url, ttl_seconds=60))
    assert backend.alive(sandbox)

    backend.destroy(sandbox)
    backend.destroy(sandbox)  # idempotent

    assert not backend.alive(sandbox)
    assert qemu_processes(sandbox.workdir) == []
    assert not Path(sandbox.workdir).exists()


def test_the_ttl_kills_a_vm_whose_worker_was_killed(sandbox_root: Path, proxy: EgressProxy) -> None:
    project = Path(__file__).resolve().parents[2]
    config = microvm_config(sandbox_root)
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from pathlib import Path
                sys.path.insert(0, {str(project)!r})
                from sessions.engine.config import EngineConfig
                from sessions.engine.sandbox.base import SandboxSpec
                from sessions.engine.sandbox.microvm.backend import MicroVMBackend
                config = EngineConfig(
                    sandbox_dir=Path({str(config.sandbox_dir)!r}),
                    microvm_image_dir=Path({str(config.microvm_image_dir)!r}),
                    microvm_accelerator={config.microvm_accelerator!r},
                    microvm_memory_mib={config.microvm_memory_mib!r},
                )
                sandbox = MicroVMBackend(config).create(
                    SandboxSpec(run_key="vm-orphan", proxy_url={proxy.url!r}, ttl_seconds=25)
                )
                print(sandbox.workdir, flush=True)
                time.sleep(600)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=project,
    )
    assert worker.stdout is not None
    workdir = worker.stdout.readline().strip()
    assert workdir, "the worker did not start its VM"
    assert qemu_processes(workdir)

    worker.send_signal(signal.SIGKILL)
    worker.wait()

    # The VM is not the worker's child any more: its watchdog ends it at the deadline.
    assert qemu_processes(workdir)
    end = time.monotonic() + 60
    while (qemu_processes(workdir) or Path(workdir).exists()) and time.monotonic() < end:
        time.sleep(0.5)
    assert qemu_processes(workdir) == []
    assert not Path(workdir).exists()


def leftovers(root: Path) -> list[Path]:
    """What a finished run left in the sandbox root: nothing but the egress supervisors' shared
    parent directory, which stays (empty) for the next run."""
    return [p for p in root.iterdir() if not (p.name == "egress" and not any(p.iterdir()))]


@pytest.mark.django_db(transaction=True)
def test_the_demo_workflows_first_steps_run_in_a_microvm(
    operator: User,
    acme_credential: Credential,
    portal_server: PortalServer,
    portal: str,
    settings: Any,
    tmp_path: Path,
    guest_image: GuestImage,
    sandbox_root: Path,
) -> None:
    settings.SANDBOX_BACKEND = "microvm"
    settings.RUN_FILES_DIR = tmp_path / "runs"
    settings.ENGINE_CONFIG = replace(settings.ENGINE_CONFIG, sandbox_dir=sandbox_root)
    document = yaml.safe_load(EXAMPLE.read_text().replace("127.0.0.1:8001", portal[7:]))
    # Log in (a credential typed into the guest's browser) and see the signed-in dashboard: the
    # part of the demo that matters for isolation. Each further step would add minutes of
    # software-emulated page loads and prove nothing more here.
    first = ("open-login", "log-in", "wait-dashboard")
    document["steps"] = [step for step in document["steps"] if step["id"] in first]
    workflow = publish(operator, document)
    invoice = next(i for i in portal_server.state.invoices() if i.status == "open")
    run = services.run_launch(
        workflow_id=workflow.pk,
        user=operator,
        raw_inputs={"invoice": invoice.number, "amount": f"{invoice.amount_due:.2f}"},
    )

    execution.run_execute(run_id=run.pk)

    run.refresh_from_db()
    steps = list(run.step_results.order_by("index"))
    assert run.status == Run.Status.SUCCEEDED, (
        run.failure_reason,
        [(s.step_id, s.error) for s in steps],
    )
    assert [s.step_id for s in steps] == list(first)
    assert run.sandbox_backend == "microvm"
    assert run.sandbox_ready_seconds is not None
    assert run.sandbox is None
    assert leftovers(sandbox_root) == []


def ask_guest(sandbox: Sandbox, line: str) -> str:
    """One request to the guest's control port (see guest/pandaweb-control), from QEMU's network
    namespace when it has one (the port listens there), on a thread of its own."""
    qemu_netns = f"/proc/{sandbox.pid}/ns/net"
    answers: list[str] = []
    failures: list[BaseException] = []

    def ask() -> None:
        try:
            if os.readlink(qemu_netns) != os.readlink("/proc/self/ns/net"):
                cdp_gate.enter_network_namespace(qemu_netns)
            address = ("127.0.0.1", sandbox.details["control_port"])
            with socket.create_connection(address, timeout=60) as conn:
                replies = conn.makefile("rb")
                assert replies.readline().strip() == b"ready"
                conn.sendall(f"{line}\n".encode())
                answers.append(replies.readline().decode().strip())
        except BaseException as exc:
            failures.append(exc)

    asker = threading.Thread(target=ask)
    asker.start()
    asker.join()
    if failures:
        raise failures[0]
    return answers[0]


class Sink:
    """A loopback listener that counts who connects: any count above zero is a leak."""

    def __init__(self, host: str) -> None:
        self.connections = 0
        self.server = socket.create_server((host, 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()


def test_the_guest_reaches_allowlisted_hosts_through_its_proxy_and_nothing_else(
    backend: MicroVMBackend, portal: str
) -> None:
    denied: list[Any] = []
    proxy = EgressProxy(EgressPolicy([portal.removeprefix("http://")]), on_denied=denied.append)
    proxy.start()
    # In QEMU's user network 10.0.2.2 is the host's loopback: without restrict=on the guest
    # would reach this sink (and every other service on 127.0.0.1) directly.
    sink = Sink("127.0.0.1")
    sandbox = backend.create(SandboxSpec(run_key="vm-egress", proxy_url=proxy.url, ttl_seconds=600))
    try:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as playwright:
            browser = connect_drawing(playwright, sandbox.cdp_url, timeout=120_000)
            page = browser.contexts[0].pages[0]
            page.set_default_timeout(120_000)
            page.goto(f"{portal}/login")
            assert page.get_by_label("Username").count() == 1

            for url in ("http://portal.example.invalid/", f"http://10.0.2.2:{sink.port}/"):
                # A refusal is a failed connection, never an answer the page could take as sent.
                with pytest.raises(PlaywrightError, match="net::ERR_"):
                    page.goto(url)
            browser.close()

        assert ask_guest(sandbox, f"probe 10.0.2.2 {sink.port}") == "ok closed"
        portal_port = portal.rsplit(":", 1)[1]
        assert ask_guest(sandbox, f"probe 10.0.2.2 {portal_port}") == "ok closed"
        assert ask_guest(sandbox, "probe 10.0.2.3 53") == "ok closed"  # QEMU's DNS forwarder
        assert ask_guest(sandbox, "resolve pandaweb-probe.invalid") == "ok unresolved"
    finally:
        backend.destroy(sandbox)
        proxy.stop()
        sink.server.close()

    assert sink.connections == 0
    denied_hosts = {attempt.host for attempt in denied}
    assert {"portal.example.invalid", "10.0.2.2"} <= denied_hosts


def first_goto(page: Any, url: str) -> None:
    """The first navigation in a VM just restored: once, under TCG on a CPU-starved host, it was
    aborted before the portal saw it (net::ERR_ABORTED); a second try is what a person would
    do. Any other error, or a second abort, fails the test."""
    try:
        page.goto(url)
    except PlaywrightError as error:
        if "net::ERR_ABORTED" not in str(error):
            raise
        page.goto(url)


def log_in(cdp_url: str, portal: str) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = connect_drawing(playwright, cdp_url, timeout=120_000)
        page = browser.contexts[0].pages[0]
        page.set_default_timeout(180_000)
        first_goto(page, f"{portal}/login")
        page.get_by_label("Username").fill("acme-demo")
        page.get_by_label("Password").fill("portal-demo-2026")
        page.get_by_role("button", name="Sign in").click()
        page.get_by_text("Open invoices").first.wait_for()
        browser.close()


def bake(backend: MicroVMBackend, proxy: EgressProxy, portal: str, state: Path) -> None:
    """Log in once in a VM and save it: what a session template's bake does."""
    baker = backend.create(SandboxSpec(run_key="vm-bake", proxy_url=proxy.url, ttl_seconds=900))
    try:
        log_in(baker.cdp_url, portal)
    except BaseException:
        backend.destroy(baker)
        raise
    backend.snapshot(baker, state)
    assert not backend.alive(baker)  # the baked browser never goes on itself
    assert qemu_processes(baker.workdir) == []


def start_and_mark(cdp_url: str, portal: str, mark: str | None) -> dict[str, Any]:
    """Open the dashboard in a forked VM; optionally set a cookie; report what it saw."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = connect_drawing(playwright, cdp_url, timeout=120_000)
        page = browser.contexts[0].pages[0]
        page.set_default_timeout(180_000)
        first_goto(page, f"{portal}/")
        logged_in = page.get_by_text("Open invoices").count() > 0
        if mark:
            page.evaluate(f"document.cookie = 'fork={mark}; path=/'")
        cookies = page.evaluate("document.cookie")
        browser.close()
    return {"logged_in": logged_in, "cookies": cookies}


@pytest.fixture(scope="module")
def template_state(
    guest_image: GuestImage, portal: str, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A VM logged in to the portal and saved, as a session template's bake leaves it."""
    root = tmp_path_factory.mktemp("bake")
    root.chmod(0o700)
    proxy = EgressProxy(EgressPolicy([portal.removeprefix("http://")]), on_denied=lambda _: None)
    proxy.start()
    try:
        bake(MicroVMBackend(microvm_config(root)), proxy, portal, root / "template.state")
    finally:
        proxy.stop()
    return root / "template.state"


def test_forks_of_a_saved_logged_in_vm_start_logged_in_and_are_independent(
    backend: MicroVMBackend, proxy: EgressProxy, portal: str, template_state: Path
) -> None:
    forks = [
        backend.create(
            SandboxSpec(run_key=f"vm-fork-{i}", proxy_url=proxy.url, ttl_seconds=600,
                        restore_from=str(template_state))
        )
        for i in range(2)
    ]  # fmt: skip
    try:
        assert [f.details["start"] for f in forks] == ["session template fork"] * 2
        seen: dict[int, dict[str, Any]] = {}

        def visit(i: int) -> None:
            seen[i] = start_and_mark(forks[i].cdp_url, portal, "first" if i == 0 else None)

        threads = [threading.Thread(target=visit, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # The second looks again after the first set its cookie.
        seen[1] = start_and_mark(forks[1].cdp_url, portal, None)
    finally:
        for fork in forks:
            backend.destroy(fork)

    assert seen[0]["logged_in"]
    assert seen[1]["logged_in"]
    assert "fork=first" in seen[0]["cookies"]
    assert "fork=first" not in seen[1]["cookies"]


def test_a_fork_of_a_template_whose_portal_session_ended_wakes_up_logged_out(
    backend: MicroVMBackend,
    proxy: EgressProxy,
    portal: str,
    portal_server: PortalServer,
    template_state: Path,
) -> None:
    portal_server.state.close_all_sessions()

    fork = backend.create(
        SandboxSpec(run_key="vm-stale-fork", proxy_url=proxy.url, ttl_seconds=600,
                    restore_from=str(template_state))
    )  # fmt: skip
    try:
        seen = start_and_mark(fork.cdp_url, portal, None)
    finally:
        backend.destroy(fork)
    # What the runner's logged-in check then sees (and fails the run with "stale — re-bake").
    assert not seen["logged_in"]


def test_the_warm_pool_hands_each_restored_vm_to_one_run_only(
    guest_image: GuestImage, sandbox_root: Path, proxy: EgressProxy
) -> None:
    backend = MicroVMBackend(microvm_config(sandbox_root, microvm_pool=1))
    pool = backend._pool(guest_image, (1280, 900))

    def idle() -> list[str]:
        return [vm.workdir.name for vm in pool._idle]

    try:
        pool.take()  # asks the pool to fill
        end = time.monotonic() + 120
        while not idle() and time.monotonic() < end:
            time.sleep(0.5)
        waiting = idle()
        assert len(waiting) == 1
        # Until a run claims it, the VM has no relay: nothing it sends goes anywhere.
        assert not (sandbox_root / waiting[0] / "proxy.sock").exists()

        sandbox = backend.create(
            SandboxSpec(run_key="vm-pooled", proxy_url=proxy.url, ttl_seconds=60)
        )
        try:
            assert sandbox.details["start"] == "warm pool"
            assert Path(sandbox.workdir).name == waiting[0]
            assert (Path(sandbox.workdir) / "proxy.sock").exists()
        finally:
            backend.destroy(sandbox)
        assert qemu_processes(sandbox.workdir) == []

        end = time.monotonic() + 120
        while not idle() and time.monotonic() < end:
            time.sleep(0.5)
        assert idle()
        assert idle() != waiting  # a fresh VM, never the used one
    finally:
        pool.close()
    assert leftovers(sandbox_root) == []


def test_the_live_view_casts_a_vms_browser_with_its_secrets_masked(
    vm: Sandbox, backend: MicroVMBackend
) -> None:
    """The live view's CDP client reaches the guest's browser through the VM's relay, as the
    runner does, and paints over a password in every frame it hands on."""
    from playwright.sync_api import sync_playwright

    from tests.sessions.test_screencast import PAGE, close_to, pixel, run_apart

    with sync_playwright() as playwright:
        # As long as the runner waits (sessions.engine.driver.connect_timeout_ms): a loaded machine
        # makes the emulated browser slower still.
        browser = connect_drawing(playwright, vm.cdp_url, timeout=120_000)
        page = browser.contexts[0].pages[0]
        page.set_default_timeout(120_000)
        page.set_content(PAGE)
        box = page.locator("#pw").bounding_box()
        browser.close()
    assert box is not None
    frames: list[Frame] = []

    async def keep(frame: Frame) -> None:
        frames.append(frame)

    async def work() -> None:
        tap = BrowserTap(
            vm.cdp_url,
            secret_values=[],
            secret_fields=[],
            on_frame=keep,
            time_scale=backend.accelerator.time_scale,
        )
        await tap.open()
        try:
            await tap.start(fps=2)
            deadline = time.monotonic() + 180
            while not frames:
                assert time.monotonic() < deadline, "no frame came from the VM's browser"
                await asyncio.sleep(0.1)
        finally:
            await tap.close()

    run_apart(work)
    frame = frames[-1]
    assert frame.masks >= 1
    middle = pixel(frame, box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    assert close_to(middle, MASK_COLOUR)
