"""The dead-man's switch of a local sandbox: ``python -m sessions.engine.sandbox.watchdog``.

Started detached, in its own session, next to each browser. It outlives the worker that created
the sandbox (a SIGKILLed Celery child, an OOM kill), so a run whose worker died cannot leave a
logged-in browser behind: when the deadline in ``<workdir>/deadline`` passes it stops the
browser's process group and removes the workdir. The deadline is re-read on every poll, so
``extend()`` only rewrites that file. It exits as soon as the browser is gone, whoever stopped it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sessions.engine.sandbox._proc import group_alive, read_deadline, remove_workdir, stop_browser

POLL_SECONDS = 0.5


def watch(workdir: Path, pgid: int, leader: int, *, poll: float = POLL_SECONDS) -> str:
    """Block until the browser is gone; return why (for the log)."""
    path = str(workdir)
    while True:
        if not group_alive(pgid, path):
            # Helpers outside the group (a microVM's proxy relay, a crash handler) must not
            # outlive a browser that died on its own.
            stop_browser(path, None, None)
            return "browser gone"
        deadline = read_deadline(workdir)
        now = time.time()
        # A missing deadline file means someone is removing the sandbox; finishing the job is
        # harmless and covers a destroy() that was itself cut short.
        if deadline is None or now >= deadline:
            stop_browser(path, pgid, leader)
            remove_workdir(workdir)
            return "deadline passed" if deadline is not None else "workdir removed"
        time.sleep(max(0.05, min(poll, deadline - now)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--pgid", required=True, type=int)
    parser.add_argument("--leader", required=True, type=int)
    args = parser.parse_args(argv)
    reason = watch(args.workdir, args.pgid, args.leader)
    print(f"watchdog for {args.workdir}: {reason}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
