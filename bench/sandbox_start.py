"""How fast a local sandbox starts and goes away.

    .venv/bin/python bench/sandbox_start.py --runs 20

Creates and destroys local sandboxes one after another and prints create → CDP-answering and
destroy times (min / median / p95 / max). One unmeasured warm-up run comes first: the first
create imports the project package (Celery, Django) and warms the page cache for Chromium.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

# Run as a plain script: make the project importable without installing it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sessions.sandbox import SandboxSpec
from sessions.sandbox.local import LocalBackend


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return (
        f"min {ordered[0]:.3f}  median {statistics.median(ordered):.3f}  "
        f"p95 {p95:.3f}  max {ordered[-1]:.3f}  (s, n={len(ordered)})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="pandaweb-bench-") as root:
        backend = LocalBackend(root=root)
        # A bound socket that never listens: nothing is loaded during the benchmark anyway, and
        # no stray request can leave the machine.
        with socket.socket() as dead:
            dead.bind(("127.0.0.1", 0))
            proxy_url = f"http://127.0.0.1:{dead.getsockname()[1]}"
            ready: list[float] = []
            wall: list[float] = []
            destroy: list[float] = []
            for i in range(args.runs + 1):
                spec = SandboxSpec(
                    run_key=f"bench-{uuid.uuid4().hex[:8]}", proxy_url=proxy_url, ttl_seconds=60
                )
                t0 = time.perf_counter()
                sandbox = backend.create(spec)
                t1 = time.perf_counter()
                backend.destroy(sandbox)
                t2 = time.perf_counter()
                if i == 0:
                    continue
                ready.append(sandbox.ready_seconds)
                wall.append(t1 - t0)
                destroy.append(t2 - t1)

    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"local sandbox, {args.runs} runs, {os.cpu_count()} CPUs, load average {load}")
    print(f"create → CDP answering: {summary(ready)}")
    print(f"create() wall time:     {summary(wall)}")
    print(f"destroy():              {summary(destroy)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
