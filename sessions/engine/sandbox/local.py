"""The ``local`` backend: one system Chromium per run, in kernel namespaces where it can be.

Where the worker is root or may make user namespaces (``namespaces.probe()``), the browser runs in
network, mount, PID and IPC namespaces (see ``sessions.engine.sandbox.namespaces``): the kernel lets
it reach nothing but the run's proxy. Elsewhere it is isolated by a fresh profile, a private HOME
and a process group only, and the sandbox's ``details["isolation_warning"]`` says so; its only
route out is then its ``--proxy-server`` flag. ``EngineConfig.local_namespaces`` (``auto``, ``on``
or ``off``) chooses. In namespaces the browser's CDP is reached only through the run's CDP gate
(``sessions.engine.sandbox.cdp_gate``), which forwards nothing without the run's secret; without
them it listens on host loopback, open to every local process, and the warning says that too. The
browser dies at its deadline even if the worker that started it is killed. The microVM backend
adds a guest kernel.

Layout of ``<root>/<run_key>/`` (0700): ``.pandaweb-sandbox`` (marker), ``deadline`` (epoch,
rewritten by ``extend``), ``pgid``, ``sandbox.json`` (``Sandbox.to_dict()``), ``profile/``,
``home/``, ``downloads/``, ``chromium.log``, ``watchdog.log``; with namespaces also
``ns.fstab``, ``unshare.pid``, ``proxy.sock``, ``cdp.sock``, ``cdp.secret``, ``cdp-gate.port``
and the relays' logs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import secrets
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sessions.engine.chromium import (
    HEADLESS_ARGS,
    find_chromium,
    is_headless_shell,
    launch_args,
    write_profile_preferences,
)
from sessions.engine.config import EngineConfig
from sessions.engine.sandbox import cdp_gate, namespaces
from sessions.engine.sandbox._proc import (
    DEADLINE_FILE,
    MARKER,
    PGID_FILE,
    RECORD_FILE,
    atomic_write,
    read_deadline,
    read_pgid,
    remove_workdir,
    stop_browser,
)
from sessions.engine.sandbox.base import (
    BEGIN_FRAME,
    FREE_RUNNING,
    Sandbox,
    SandboxError,
    SandboxSpec,
)
from sessions.engine.sandbox.workdirs import (
    WorkdirSandboxes,
    adopt,
    ensure_root,
    json_version,
    spawn_watchdog,
)

__all__ = ["LocalBackend", "reap_orphans"]

logger = logging.getLogger(__name__)

PROCESS_GROUP_ONLY = "process group only"

# Playwright has the browser write downloads to its ``artifacts_dir`` and then reads them there
# itself; by default that is under the driver's /tmp, which a browser in namespaces does not
# share. The workdir is at the same path on both sides, so clients connect with
# ``connect_over_cdp(cdp_url, artifacts_dir=sandbox.details["artifacts_dir"])``.
ARTIFACTS_DIR = "downloads"


# Environment passed to the browser: only what it needs to run. The worker's own environment
# holds database URLs and keys that a compromised renderer could read from /proc/self/environ.
_PASSED_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "FONTCONFIG_PATH", "FONTCONFIG_FILE")


def _tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    # Chromium's log is noisy about D-Bus on servers; those lines never explain a failure.
    kept = [line for line in text.splitlines() if line.strip() and "dbus" not in line.lower()]
    return "\n".join(kept[-lines:])


def _direct_address(port_file: Path) -> str | None:
    """The browser's own debugging address, from the port it wrote to its profile, once it
    listens."""
    with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
        port = int(port_file.read_text().split()[0])
        if 0 < port < 65536:
            return f"http://127.0.0.1:{port}"
    return None


def _gated_address(workdir: Path, secret: str) -> str | None:
    """The run's address at its CDP gate, once the browser listens behind it."""
    port = namespaces.relay_port(workdir)
    return None if port is None else f"http://127.0.0.1:{port}/{secret}"


@dataclasses.dataclass(frozen=True)
class _Isolation:
    support: namespaces.Support | None  # None: no namespaces
    label: str
    warning: str = ""


class LocalBackend(WorkdirSandboxes):
    """System Chromium in its own process group (and namespaces, where the host allows), watched
    by a detached dead-man's switch.

    ``config.local_namespaces``: ``"auto"`` uses them where the host allows and otherwise falls
    back with a warning, ``"on"`` refuses to start without them, ``"off"`` never uses them.
    Workdirs go under ``config.sandbox_dir``; the browser is ``config.chromium``, or the system's.
    """

    name = "local"

    def __init__(self, config: EngineConfig, *, ready_timeout: float = 15.0) -> None:
        # Absolute: the workdir is named on command lines run from other directories (the
        # watchdog's) and in mount tables.
        self.root = config.sandbox_dir.absolute()
        self.ready_timeout = ready_timeout
        self.namespaces = config.local_namespaces
        self.chromium = config.chromium
        self.begin_frame = config.begin_frame == "auto"

    # -- create ---------------------------------------------------------------------------

    def create(self, spec: SandboxSpec) -> Sandbox:
        if spec.restore_from:
            # Session templates reach this backend as cookies loaded by the runner instead.
            raise SandboxError("the local backend cannot restore a saved browser")
        started = time.time()
        t0 = time.monotonic()
        chromium = self._chromium()
        ensure_root(self.root)
        workdir = self.root / spec.run_key
        isolation = self._isolation(workdir, spec.run_key)
        if isolation.support is not None:
            _check_socket_room(workdir)
        try:
            workdir.mkdir(mode=0o700)
        except FileExistsError:
            raise SandboxError(
                f"a sandbox for run {spec.run_key} already exists in {workdir}"
            ) from None
        procs: list[subprocess.Popen[bytes]] = []
        try:
            (workdir / MARKER).touch(mode=0o600)
            atomic_write(workdir / DEADLINE_FILE, repr(started + spec.ttl_seconds))
            secret = secrets.token_urlsafe(32)
            if isolation.support is not None:
                atomic_write(workdir / cdp_gate.SECRET_FILE, secret)
            browser = self._spawn_browser(chromium, spec, workdir, isolation.support)
            procs.append(browser)
            atomic_write(workdir / PGID_FILE, f"{browser.pid} {browser.pid}")
            # Started before waiting for CDP: a worker killed during start-up is covered too.
            watchdog = spawn_watchdog(workdir, browser.pid)
            procs.append(watchdog)
            find_address = (
                functools.partial(_direct_address, workdir / "profile" / "DevToolsActivePort")
                if isolation.support is None
                else functools.partial(_gated_address, workdir, secret)
            )
            cdp_url, version = self._wait_ready(browser, workdir, t0, find_address)
            if watchdog.poll() is not None:
                # Without its dead-man's switch a sandbox must not be handed out at all.
                tail = _tail(workdir / "watchdog.log")
                raise SandboxError(f"the sandbox watchdog exited at start:\n{tail}")
            sandbox = Sandbox(
                backend=self.name,
                run_key=spec.run_key,
                cdp_url=cdp_url,
                pid=browser.pid,
                pgid=browser.pid,
                workdir=str(workdir),
                started_at=started,
                deadline=started + spec.ttl_seconds,
                ready_seconds=time.monotonic() - t0,
                host=socket.gethostname(),
                details={
                    "isolation": isolation.label,
                    **({"isolation_warning": isolation.warning} if isolation.warning else {}),
                    "chromium": chromium,
                    "frames": frames_label(chromium, begin_frame=self.begin_frame),
                    "browser": version.get("Browser", ""),
                    "watchdog_pid": watchdog.pid,
                    "artifacts_dir": str(workdir / ARTIFACTS_DIR),
                    "proxy_url": spec.proxy_url,
                    "window_size": list(spec.window_size),
                },
            )
            atomic_write(workdir / RECORD_FILE, json.dumps(sandbox.to_dict(), indent=2))
        except BaseException as exc:
            # BaseException: a Ctrl-C or a Celery soft timeout during start-up must not leave a
            # browser running either.
            self._abandon(workdir, procs)
            if isinstance(exc, OSError):
                raise SandboxError(f"could not start the sandbox ({chromium}): {exc}") from exc
            raise
        for proc in procs:
            adopt(spec.run_key, proc)
        return sandbox

    def _abandon(self, workdir: Path, procs: list[subprocess.Popen[bytes]]) -> None:
        for proc in procs:
            with contextlib.suppress(OSError):
                proc.kill()
        stop_browser(str(workdir), procs[0].pid if procs else None, None, grace=0.0)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        if not remove_workdir(workdir):
            # Failed before the marker was written: the directory is still empty.
            with contextlib.suppress(OSError):
                workdir.rmdir()

    def _isolation(self, workdir: Path, run_key: str) -> _Isolation:
        if self.namespaces == "off":
            return _Isolation(None, PROCESS_GROUP_ONLY)
        support = namespaces.probe()
        problem = support.reason if not support.usable else namespaces.path_problem(workdir)
        if not problem:
            return _Isolation(support, support.isolation)
        if self.namespaces == "on":
            raise SandboxError(f"the browser cannot be put in namespaces: {problem}")
        warning = (
            f"{problem}: the browser's egress is enforced by its proxy flag only, and its "
            "debugging port is open to every process on this host"
        )
        logger.warning("sandbox %s without namespaces: %s", run_key, warning)
        return _Isolation(None, PROCESS_GROUP_ONLY, warning)

    def _chromium(self) -> str:
        try:
            found = find_chromium(self.chromium)
        except FileNotFoundError as exc:
            raise SandboxError(str(exc)) from exc
        if found is None:
            raise SandboxError(
                "no Chromium found on this machine: install the distribution's chromium "
                "package or set PANDAWEB_CHROMIUM"
            )
        return found

    def _spawn_browser(
        self,
        chromium: str,
        spec: SandboxSpec,
        workdir: Path,
        support: namespaces.Support | None,
    ) -> subprocess.Popen[bytes]:
        home = workdir / "home"
        home.mkdir(mode=0o700)
        (workdir / ARTIFACTS_DIR).mkdir(mode=0o700)
        width, height = spec.window_size
        if support is None:
            # Port 0: Chromium binds a free loopback port itself and writes it to
            # DevToolsActivePort, so two sandboxes starting at once cannot race for one port.
            cdp_port = 0
            routing = spec.fixed_flags
            # No private mount namespace to place the managed policy in (see namespaces):
            # the profile's own preferences switch off what they can of the browser's calls home.
            write_profile_preferences(workdir / "profile")
        else:
            # The namespace's loopback is the browser's alone; the host side of CDP is the
            # relay's port, chosen by the kernel.
            namespaces.prepare(workdir)
            cdp_port = namespaces.INNER_CDP_PORT
            inner = namespaces.browser_proxy_url(spec.proxy_url)
            routing = dataclasses.replace(spec, proxy_url=inner, extra_args=()).fixed_flags
        args = [
            chromium,
            *launch_args(chromium, begin_frame=self.begin_frame),
            f"--remote-debugging-port={cdp_port}",
            f"--user-data-dir={workdir / 'profile'}",
            *HEADLESS_ARGS,
            *routing,
            # WebRTC's UDP does not go through an HTTP proxy; forbid it rather than leak.
            "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
            f"--window-size={width},{height}",
            # A caller may repeat the routing flags verbatim; inside namespaces that would point
            # the browser back at the host's proxy address, which it cannot reach from there.
            *(arg for arg in spec.extra_args if arg not in spec.fixed_flags),
            "about:blank",
        ]
        if support is not None:
            args = namespaces.command(
                support, workdir=workdir, proxy_url=spec.proxy_url, browser=args
            )
        env = {key: os.environ[key] for key in _PASSED_ENV if key in os.environ}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        # A private HOME: Chromium keeps the NSS certificate store and caches under it, which
        # would otherwise be shared by every run on the host. It also puts the workdir on the
        # command line of the crash handler, which daemonizes out of the process group (setsid);
        # that is how stop_browser() finds and kills it. (--disable-crashpad-for-testing would
        # avoid the handler, but with it Chromium 156 aborts every navigation.)
        env.update(
            HOME=str(home),
            XDG_CONFIG_HOME=str(home / ".config"),
            XDG_CACHE_HOME=str(home / ".cache"),
            XDG_DATA_HOME=str(home / ".local" / "share"),
        )
        with open(workdir / "chromium.log", "wb") as log:
            return subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=workdir,
                start_new_session=True,
                close_fds=True,
            )

    def _wait_ready(
        self,
        browser: subprocess.Popen[bytes],
        workdir: Path,
        t0: float,
        find_address: Callable[[], str | None],
    ) -> tuple[str, dict[str, Any]]:
        cdp_url = ""
        while True:
            code = browser.poll()
            if code is not None:
                tail = _tail(workdir / "chromium.log")
                raise SandboxError(
                    f"Chromium exited with status {code} before its debugging port answered"
                    + (f"; last lines of its log:\n{tail}" if tail else "")
                )
            if not cdp_url:
                cdp_url = find_address() or ""
            if cdp_url:
                version = json_version(cdp_url, timeout=1.0)
                if version is not None:
                    return cdp_url, version
            if time.monotonic() - t0 > self.ready_timeout:
                tail = _tail(workdir / "chromium.log")
                raise SandboxError(
                    f"Chromium did not answer on its debugging port within "
                    f"{self.ready_timeout:g} s"
                    + (f"; last lines of its log:\n{tail}" if tail else "")
                )
            time.sleep(0.01)

    # -- the rest -------------------------------------------------------------------------


# The longest unix socket the namespaced sandbox makes in its directory; a socket's path holds
# at most 107 bytes (sun_path), and a longer one fails inside the namespace where nobody reads
# why: the browser would start and never answer.
_LONGEST_SOCKET = "proxy.sock"
_SOCKET_PATH_MAX = 107


def _check_socket_room(workdir: Path) -> None:
    length = len(os.fsencode(workdir / _LONGEST_SOCKET))
    if length > _SOCKET_PATH_MAX:
        raise SandboxError(
            f"the sandbox directory {workdir.parent} is too long: the sockets inside a "
            f"sandbox's directory would be {length} bytes long, and a socket's path may be at "
            f"most {_SOCKET_PATH_MAX}; set PANDAWEB_SANDBOX_DIR to a shorter path"
        )


def frames_label(chromium: str, *, begin_frame: bool) -> str:
    """How the sandbox's browser draws its pages, for the run page (``details["frames"]``)."""
    if begin_frame and is_headless_shell(chromium):
        return BEGIN_FRAME
    return FREE_RUNNING


def reap_orphans(root_dir: Path | str, *, now: float | None = None) -> list[str]:
    """Destroy the sandboxes under ``root_dir`` whose deadline has passed; return their run keys.

    Belt and braces for the watchdogs (one may have been killed, or the host rebooted mid-run).
    Also removes directories a creator abandoned before it wrote a deadline. Idempotent and safe
    to run concurrently with watchdogs and ``destroy()``.
    """
    root = Path(root_dir)
    now = time.time() if now is None else now
    reaped: list[str] = []
    try:
        entries = sorted(root.iterdir())
    except FileNotFoundError:
        return reaped
    for workdir in entries:
        if workdir.is_symlink() or not workdir.is_dir() or not (workdir / MARKER).is_file():
            continue
        deadline = read_deadline(workdir)
        if deadline is None:
            # create() writes the deadline right after the marker: only a creator that died in
            # between leaves this, but give a live one the benefit of the doubt for a minute.
            with contextlib.suppress(FileNotFoundError):
                if now - (workdir / MARKER).stat().st_mtime < 60:
                    continue
        elif deadline > now:
            continue
        group = read_pgid(workdir)
        stop_browser(str(workdir), *(group or (None, None)))
        if remove_workdir(workdir):
            reaped.append(workdir.name)
    return reaped
