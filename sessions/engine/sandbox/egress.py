"""A run's egress supervisor: ``python -m sessions.engine.sandbox.egress --dir <dir>`` (no Django).

The run's ``EgressProxy`` runs here, in a detached process of its own session, not in the worker
that started the browser: a worker may be restarted (a deploy) or killed while the run waits for
a person, and the browser must keep its one way out, judged by the same policy, for whichever
worker of the host continues it.

Layout of ``<dir>`` (0700, ``<sandbox root>/egress/<run key>``):

``policy.json``   the allowlist from the published version (written by the starter)
``deadline``      epoch seconds; the supervisor exits when it passes or the file is removed
``sandbox``       the browser's workdir, once known; the supervisor exits when it is gone
``port``          the proxy's loopback port, written once it listens
``pid``           the supervisor's pid
``denials.jsonl`` the spool: one JSON line per refusal, numbered from 1, appended only

Every refusal is appended to the spool before the browser gets its 403. Workers drain it into
the run's events and audit trail under the run's row lock, remembering the last number drained
in the run's sandbox record, so a line is recorded once whoever drains it and whenever.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from sessions.engine.egress_policy import EgressPolicy
from sessions.engine.proxy import DeniedAttempt, EgressProxy
from sessions.engine.sandbox._proc import atomic_write, mentions, read_deadline, strays

POLICY_FILE = "policy.json"
DEADLINE_FILE = "deadline"
SANDBOX_FILE = "sandbox"
PORT_FILE = "port"
PID_FILE = "pid"
SPOOL_FILE = "denials.jsonl"
LOG_FILE = "egress.log"

POLL_SECONDS = 0.25
_PROJECT_ROOT = Path(__file__).resolve().parents[3]


class EgressError(Exception):
    """The supervisor could not be started; the message says why."""


# -- the starter's side -----------------------------------------------------------------------


class Egress:
    """A handle on a running supervisor, from any process of the host (built from its dir)."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)

    @property
    def port(self) -> int:
        try:
            return int((self.directory / PORT_FILE).read_text())
        except (FileNotFoundError, ValueError):
            raise EgressError(f"the egress proxy in {self.directory} is not listening") from None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        with contextlib.suppress(FileNotFoundError, ValueError):
            return int((self.directory / PID_FILE).read_text())
        return None

    def alive(self) -> bool:
        """Whether the supervisor still runs (its pid lives and names this directory)."""
        pid = self.pid
        if pid is None:
            return False
        try:
            args = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            return False
        return mentions([a.decode(errors="replace") for a in args if a], str(self.directory))

    def link(self, workdir: str) -> None:
        """Tie the supervisor's life to the browser's workdir (it exits once that is gone)."""
        atomic_write(self.directory / SANDBOX_FILE, workdir)

    def extend(self, deadline: float) -> None:
        with contextlib.suppress(FileNotFoundError):
            atomic_write(self.directory / DEADLINE_FILE, repr(deadline))

    @property
    def quiet_denied_count(self) -> int:
        return sum(1 for line in read_spool(self.directory) if line.get("quiet"))

    def stop(self, *, grace: float = 2.0) -> None:
        """Stop the supervisor and wait for it; the directory (and its spool) stays."""
        with contextlib.suppress(FileNotFoundError):
            (self.directory / DEADLINE_FILE).unlink()
        pid = self.pid
        if pid is not None and self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        end = time.monotonic() + grace
        while self.alive() and time.monotonic() < end:
            time.sleep(0.02)
        for stray in strays(str(self.directory)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(stray, signal.SIGKILL)

    def remove(self) -> None:
        """Stop it and delete its directory (once the spool is drained)."""
        self.stop()
        for child in list(self.directory.glob("*")) + list(self.directory.glob(".*")):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                child.unlink()
        with contextlib.suppress(OSError):
            self.directory.rmdir()


def start(
    directory: Path, *, allowed_hosts: list[str], deadline: float, timeout: float = 10.0
) -> Egress:
    """Start a supervisor for one run and return once its proxy listens.

    On failure, raise ``EgressError`` having stopped what was started.
    """
    directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        directory.mkdir(mode=0o700)
    except FileExistsError:
        raise EgressError(f"an egress supervisor already uses {directory}") from None
    atomic_write(directory / POLICY_FILE, json.dumps({"allowed_hosts": list(allowed_hosts)}))
    atomic_write(directory / DEADLINE_FILE, repr(deadline))
    env = {key: os.environ[key] for key in ("PATH", "LANG", "TZ") if key in os.environ}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    with open(directory / LOG_FILE, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sessions.engine.sandbox.egress", "--dir", str(directory)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=_PROJECT_ROOT,
            # Its own session: a worker that is killed, with its process group, spares it.
            start_new_session=True,
            close_fds=True,
        )
    # Reaped by a thread so a long-lived worker collects no zombie when it exits.
    threading.Thread(target=proc.wait, name=f"egress-reap-{proc.pid}", daemon=True).start()
    handle = Egress(directory)
    end = time.monotonic() + timeout
    while not (directory / PORT_FILE).exists():
        if proc.poll() is not None or time.monotonic() > end:
            handle.stop(grace=0.5)
            tail = (directory / LOG_FILE).read_text(errors="replace")[-1500:]
            raise EgressError(f"the egress proxy did not start:\n{tail}")
        time.sleep(0.005)
    return handle


def read_spool(directory: Path, after: int = 0, *, name: str = SPOOL_FILE) -> list[dict[str, Any]]:
    """The spool's complete lines numbered above ``after`` (a line being written is skipped)."""
    try:
        raw = (directory / name).read_bytes()
    except FileNotFoundError:
        return []
    lines = []
    for line in raw.split(b"\n")[:-1]:  # the last piece lacks its newline until it is complete
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and int(entry.get("n", 0)) > after:
                lines.append(entry)
    return lines


# -- the supervisor's side --------------------------------------------------------------------


class _Spool:
    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()
        self._n = len(read_spool(path.parent))
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def append(self, attempt: DeniedAttempt) -> None:
        with self._lock:
            self._n += 1
            line = {
                "n": self._n,
                "host": attempt.host,
                "port": attempt.port,
                "method": attempt.method,
                "reason": attempt.reason,
                "at": attempt.at.isoformat(),
                "quiet": attempt.quiet,
            }
            # One write of one line on an O_APPEND descriptor: readers see it whole or not yet.
            os.write(self._fd, (json.dumps(line) + "\n").encode())


def _should_exit(directory: Path) -> str | None:
    deadline = read_deadline(directory)
    if deadline is None:
        return "stopped"
    if time.time() >= deadline:
        return "deadline passed"
    with contextlib.suppress(FileNotFoundError):
        workdir = (directory / SANDBOX_FILE).read_text().strip()
        if workdir and not Path(workdir).exists():
            return "sandbox gone"
    return None


def serve(directory: Path) -> str:
    policy = json.loads((directory / POLICY_FILE).read_text())
    spool = _Spool(directory / SPOOL_FILE)
    proxy = EgressProxy(EgressPolicy(policy.get("allowed_hosts", [])), on_denied=spool.append)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    proxy.start()
    atomic_write(directory / PID_FILE, str(os.getpid()))
    atomic_write(directory / PORT_FILE, str(proxy.port))
    try:
        while not stopping.wait(POLL_SECONDS):
            reason = _should_exit(directory)
            if reason:
                return reason
        return "terminated"
    finally:
        proxy.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", required=True, type=Path)
    args = parser.parse_args(argv)
    reason = serve(args.dir)
    print(f"egress supervisor for {args.dir}: {reason}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
