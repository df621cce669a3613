"""What the backends that keep each sandbox in a local work directory share (no Django imports).

The ``local`` and ``microvm`` backends lay out ``<root>/<name>/`` alike (marker, ``deadline``,
``pgid``, ``sandbox.json``), start the same watchdog next to each sandbox and are destroyed,
checked and extended the same way; only how the browser is started differs.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from sessions.engine.sandbox._proc import (
    DEADLINE_FILE,
    RECORD_FILE,
    atomic_write,
    group_alive,
    remove_workdir,
    stop_browser,
)
from sessions.engine.sandbox.base import Sandbox, SandboxError

_PROJECT_ROOT = Path(__file__).resolve().parents[3]

# Popen objects of sandboxes this process started, so that destroy() here can reap them at once.
# A daemon thread per child also reaps whenever it exits (killed by the watchdog, by a reaper in
# another process, or crashed), so long-lived workers collect no zombies.
_CHILDREN: dict[str, list[subprocess.Popen[bytes]]] = {}
_CHILDREN_LOCK = threading.Lock()


def adopt(key: str, proc: subprocess.Popen[bytes]) -> None:
    with _CHILDREN_LOCK:
        _CHILDREN.setdefault(key, []).append(proc)
    threading.Thread(target=proc.wait, name=f"sandbox-reap-{proc.pid}", daemon=True).start()


def release(key: str) -> None:
    with _CHILDREN_LOCK:
        procs = _CHILDREN.pop(key, [])
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def ensure_root(root: Path) -> None:
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = root.lstat()
    # Under a shared /tmp another local user could pre-create the root and watch or swap our
    # profiles; refuse anything we do not own outright.
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise SandboxError(f"sandbox directory {root} is not a directory owned by this user")
    if info.st_mode & 0o022:
        raise SandboxError(f"sandbox directory {root} is writable by other users")


def json_version(cdp_url: str, timeout: float) -> dict[str, Any] | None:
    """The browser's ``/json/version`` answer, or None while it does not answer."""
    # An explicit empty ProxyHandler: urllib would otherwise honour http_proxy from the worker's
    # environment and send our loopback probe to some other machine.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{cdp_url}/json/version", timeout=timeout) as response:
            data = json.loads(response.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return data if isinstance(data, dict) else None


def spawn_watchdog(workdir: Path, pgid: int) -> subprocess.Popen[bytes]:
    """Start the sandbox's dead-man's switch (``sessions.engine.sandbox.watchdog``), detached."""
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
                "sessions.engine.sandbox.watchdog",
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


class WorkdirSandboxes:
    """``destroy``, ``alive`` and ``extend`` for sandboxes kept in work directories."""

    def _check_workdir(self, sandbox: Sandbox, workdir: Path) -> None:
        """Refuse a record whose workdir is not the sandbox's own: destroy() deletes it."""
        if workdir.name != sandbox.run_key:
            raise SandboxError(f"sandbox record of {sandbox.run_key} names workdir {workdir}")

    def destroy(self, sandbox: Sandbox) -> None:
        sandbox.check_host()
        workdir = Path(sandbox.workdir)
        self._check_workdir(sandbox, workdir)
        # Deleting the deadline first tells the watchdog the sandbox is going away.
        with contextlib.suppress(FileNotFoundError):
            (workdir / DEADLINE_FILE).unlink()
        stop_browser(str(workdir), sandbox.pgid, sandbox.pid)
        release(sandbox.run_key)
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
