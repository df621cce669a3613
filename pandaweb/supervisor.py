"""Start the processes of one installation, wait until they answer, stop them all together.

No Django imports. Each child runs in its own session (process group), so stopping it reaches
everything it spawned (Celery's pool processes, Chromium helpers) and nothing outlives ``up``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType


@dataclass
class Child:
    name: str
    argv: Sequence[str]
    ready_url: str | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(list(self.argv), env=env, start_new_session=True)

    @property
    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def signal_group(self, signum: int) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)


class Stop(Exception):
    pass


def url_answers(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (loopback URLs we built)
            return bool(response.status < 500)
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except (urllib.error.URLError, OSError):
        return False


def run(
    children: list[Child],
    *,
    on_ready: Callable[[], None],
    ready_timeout: float = 90.0,
    stop_grace: float = 10.0,
) -> int:
    """Run ``children`` until a signal arrives or one of them exits.

    Returns 0 after a requested stop, 1 if a child exited on its own or never became ready.
    """

    def request_stop(signum: int, frame: FrameType | None) -> None:
        raise Stop

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    env = dict(os.environ)
    status = 0
    try:
        for child in children:
            child.start(env)
        deadline = time.monotonic() + ready_timeout
        waiting = [c for c in children if c.ready_url]
        while waiting:
            _fail_if_any_exited(children)
            if time.monotonic() > deadline:
                names = ", ".join(c.name for c in waiting)
                print(f"up: {names} did not answer within {ready_timeout:.0f} s", file=sys.stderr)
                return 1
            waiting = [c for c in waiting if not url_answers(str(c.ready_url))]
            time.sleep(0.3)
        on_ready()
        while True:
            _fail_if_any_exited(children)
            time.sleep(0.5)
    except Stop:
        status = 0
    except ChildExited as exc:
        print(f"up: {exc}; stopping the others", file=sys.stderr)
        status = 1
    finally:
        # A second Ctrl-C while stopping must not leave children behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop_all(children, grace=stop_grace)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return status


class ChildExited(Exception):
    pass


def _fail_if_any_exited(children: list[Child]) -> None:
    for child in children:
        if child.exited and child.process is not None:
            raise ChildExited(f"{child.name} exited with status {child.process.returncode}")


def stop_all(children: list[Child], *, grace: float) -> None:
    """SIGTERM every child's process group, then SIGKILL what is left after ``grace`` seconds."""
    for child in children:
        child.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for child in children:
        if child.process is None:
            continue
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        # Also reap grandchildren that ignored SIGTERM, even when the leader has exited.
        child.signal_group(signal.SIGKILL)
        child.process.wait()


# daphne refuses a websocket its application has not accepted within this many seconds (its own
# default is 5). A page's handshake waits for the consumer's permission check, which with a
# hundred viewers opening at once on a busy two-core host took longer than that.
WEBSOCKET_CONNECT_TIMEOUT_SECONDS = 30


def dashboard_argv(python: str, host: str, port: int) -> list[str]:
    """The dashboard's command: daphne serving the ASGI application."""
    return [
        python, "-m", "daphne", "-b", host, "-p", str(port),
        "--websocket_connect_timeout", str(WEBSOCKET_CONNECT_TIMEOUT_SECONDS),
        "pandaweb.asgi:application",
    ]  # fmt: skip
