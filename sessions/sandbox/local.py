"""The ``local`` backend: one system Chromium per run, isolated as a process group.

Isolation is a fresh profile, a private HOME and a process group, not a kernel boundary; the
microVM backend provides that. What this backend does guarantee: the browser's only route out is
the run's proxy, CDP listens on loopback only, and the browser dies at its deadline even if the
worker that started it is killed.

Layout of ``<root>/<run_key>/`` (0700): ``.pandaweb-sandbox`` (marker), ``deadline`` (epoch,
rewritten by ``extend``), ``pgid``, ``sandbox.json`` (``Sandbox.to_dict()``), ``profile/``,
``home/``, ``chromium.log``, ``watchdog.log``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from sessions.sandbox._proc import (
    DEADLINE_FILE,
    MARKER,
    PGID_FILE,
    RECORD_FILE,
    atomic_write,
    group_alive,
    read_deadline,
    read_pgid,
    remove_workdir,
    stop_browser,
)
from sessions.sandbox.base import Sandbox, SandboxError, SandboxSpec, default_root

__all__ = ["LocalBackend", "reap_orphans"]

_PROJECT_ROOT = Path(__file__).resolve().parents[2]

# Popen objects of browsers and watchdogs this process started, so that destroy() here can reap
# them at once. A daemon thread per child also reaps whenever it exits (killed by the watchdog,
# by a reaper in another process, or crashed), so long-lived workers collect no zombies.
_CHILDREN: dict[str, list[subprocess.Popen[bytes]]] = {}
_CHILDREN_LOCK = threading.Lock()

# Environment passed to the browser: only what it needs to run. The worker's own environment
# holds database URLs and keys that a compromised renderer could read from /proc/self/environ.
_PASSED_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "FONTCONFIG_PATH", "FONTCONFIG_FILE")


def _adopt(run_key: str, proc: subprocess.Popen[bytes]) -> None:
    with _CHILDREN_LOCK:
        _CHILDREN.setdefault(run_key, []).append(proc)
    threading.Thread(target=proc.wait, name=f"sandbox-reap-{proc.pid}", daemon=True).start()


def _release(run_key: str) -> None:
    with _CHILDREN_LOCK:
        procs = _CHILDREN.pop(run_key, [])
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def _tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    # Chromium's log is noisy about D-Bus on servers; those lines never explain a failure.
    kept = [line for line in text.splitlines() if line.strip() and "dbus" not in line.lower()]
    return "\n".join(kept[-lines:])


def _json_version(cdp_url: str, timeout: float) -> dict[str, Any] | None:
    # An explicit empty ProxyHandler: urllib would otherwise honour http_proxy from the worker's
    # environment and send our loopback probe to some other machine.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{cdp_url}/json/version", timeout=timeout) as response:
            data = json.loads(response.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return data if isinstance(data, dict) else None


def _ensure_root(root: Path) -> None:
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = root.lstat()
    # Under a shared /tmp another local user could pre-create the root and watch or swap our
    # profiles; refuse anything we do not own outright.
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise SandboxError(f"sandbox directory {root} is not a directory owned by this user")
    if info.st_mode & 0o022:
        raise SandboxError(f"sandbox directory {root} is writable by other users")


class LocalBackend:
    """System Chromium in its own process group, watched by a detached dead-man's switch."""

    name = "local"

    def __init__(self, root: Path | str | None = None, *, ready_timeout: float = 15.0) -> None:
        self.root = Path(root) if root is not None else default_root()
        self.ready_timeout = ready_timeout

    # -- create ---------------------------------------------------------------------------

    def create(self, spec: SandboxSpec) -> Sandbox:
        started = time.time()
        t0 = time.monotonic()
        chromium = self._chromium()
        _ensure_root(self.root)
        workdir = self.root / spec.run_key
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
            browser = self._spawn_browser(chromium, spec, workdir)
            procs.append(browser)
            atomic_write(workdir / PGID_FILE, f"{browser.pid} {browser.pid}")
            # Started before waiting for CDP: a worker killed during start-up is covered too.
            watchdog = self._spawn_watchdog(workdir, browser.pid)
            procs.append(watchdog)
            cdp_url, version = self._wait_ready(browser, workdir, t0)
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
                    "isolation": "process",
                    "chromium": chromium,
                    "browser": version.get("Browser", ""),
                    "watchdog_pid": watchdog.pid,
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
            _adopt(spec.run_key, proc)
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

    def _chromium(self) -> str:
        from pandaweb.browser import find_chromium

        try:
            found = find_chromium()
        except FileNotFoundError as exc:
            raise SandboxError(str(exc)) from exc
        if found is None:
            raise SandboxError(
                "no Chromium found on this machine: install the distribution's chromium "
                "package or set PANDAWEB_CHROMIUM"
            )
        return found

    def _spawn_browser(
        self, chromium: str, spec: SandboxSpec, workdir: Path
    ) -> subprocess.Popen[bytes]:
        from pandaweb.browser import HEADLESS_ARGS

        home = workdir / "home"
        home.mkdir(mode=0o700)
        width, height = spec.window_size
        args = [
            chromium,
            "--headless=new",
            # Port 0: Chromium binds a free loopback port itself and writes it to
            # DevToolsActivePort, so two sandboxes starting at once cannot race for one port.
            "--remote-debugging-port=0",
            f"--user-data-dir={workdir / 'profile'}",
            *HEADLESS_ARGS,
            *spec.fixed_flags,
            # WebRTC's UDP does not go through an HTTP proxy; forbid it rather than leak.
            "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
            f"--window-size={width},{height}",
            *spec.extra_args,
            "about:blank",
        ]
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

    def _spawn_watchdog(self, workdir: Path, pgid: int) -> subprocess.Popen[bytes]:
        env = {key: os.environ[key] for key in ("PATH", "LANG", "TZ") if key in os.environ}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        with open(workdir / "watchdog.log", "wb") as log:
            return subprocess.Popen(
                [
                    sys.executable,
                    # Standard library only: skipping site-packages makes it start faster while
                    # the browser next to it competes for the same CPUs. ``-m`` with the project
                    # root as working directory finds the package without installing it.
                    "-S",
                    "-m",
                    "sessions.sandbox.watchdog",
                    "--workdir",
                    str(workdir),
                    "--pgid",
                    str(pgid),
                    "--leader",
                    str(pgid),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=_PROJECT_ROOT,
                # Its own session: killing the browser's group, or the worker's, spares it.
                start_new_session=True,
                close_fds=True,
            )

    def _wait_ready(
        self, browser: subprocess.Popen[bytes], workdir: Path, t0: float
    ) -> tuple[str, dict[str, Any]]:
        port_file = workdir / "profile" / "DevToolsActivePort"
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
                with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
                    port = int(port_file.read_text().split()[0])
                    if 0 < port < 65536:
                        cdp_url = f"http://127.0.0.1:{port}"
            if cdp_url:
                version = _json_version(cdp_url, timeout=1.0)
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

    def destroy(self, sandbox: Sandbox) -> None:
        sandbox.check_host()
        workdir = Path(sandbox.workdir)
        if workdir.name != sandbox.run_key:
            raise SandboxError(f"sandbox record of {sandbox.run_key} names workdir {workdir}")
        # Deleting the deadline first tells the watchdog the sandbox is going away.
        with contextlib.suppress(FileNotFoundError):
            (workdir / DEADLINE_FILE).unlink()
        stop_browser(str(workdir), sandbox.pgid, sandbox.pid)
        _release(sandbox.run_key)
        if not remove_workdir(workdir):
            raise SandboxError(f"could not remove {workdir}: not a sandbox directory")

    def alive(self, sandbox: Sandbox) -> bool:
        sandbox.check_host()
        return group_alive(sandbox.pgid, sandbox.workdir)

    def extend(self, sandbox: Sandbox, deadline: float) -> None:
        sandbox.check_host()
        workdir = Path(sandbox.workdir)
        gone = SandboxError(f"sandbox {sandbox.run_key} is gone; its deadline cannot move")
        if not group_alive(sandbox.pgid, sandbox.workdir):
            raise gone
        try:
            atomic_write(workdir / DEADLINE_FILE, repr(deadline))
        except FileNotFoundError:
            raise gone from None
        # The watchdog may have read the old deadline just before the write and be killing it.
        if not group_alive(sandbox.pgid, sandbox.workdir):
            raise gone
        sandbox.deadline = deadline
        with contextlib.suppress(OSError):
            atomic_write(workdir / RECORD_FILE, json.dumps(sandbox.to_dict(), indent=2))


def reap_orphans(root_dir: Path | str | None = None, *, now: float | None = None) -> list[str]:
    """Destroy the sandboxes under ``root_dir`` whose deadline has passed; return their run keys.

    Belt and braces for the watchdogs (one may have been killed, or the host rebooted mid-run).
    Also removes directories a creator abandoned before it wrote a deadline. Idempotent and safe
    to run concurrently with watchdogs and ``destroy()``.
    """
    root = Path(root_dir) if root_dir is not None else default_root()
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
