"""How fast a local sandbox starts and goes away, plain and in namespaces.

    .venv/bin/python bench/sandbox_start.py --runs 20

Creates and destroys local sandboxes one after another and prints create → CDP-answering and
destroy times (min / median / p95 / max) for the plain backend (process group only) and the
namespaced one (network, mount, PID and IPC namespaces with socat relays). The two alternate
run by run, so a machine whose load changes during the benchmark skews both alike. One
unmeasured warm-up run of each comes first: the first create imports the project package
(Celery, Django), probes for namespaces and warms the page cache for Chromium.
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

from _harness import engine_config

from sessions.engine.sandbox import namespaces
from sessions.engine.sandbox.base import SandboxSpec
from sessions.engine.sandbox.local import LocalBackend

MODES = {"off": "plain (process group only)", "on": "namespaced"}


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

    support = namespaces.probe()
    modes = list(MODES) if support.usable else ["off"]
    ready: dict[str, list[float]] = {mode: [] for mode in modes}
    wall: dict[str, list[float]] = {mode: [] for mode in modes}
    destroy: dict[str, list[float]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory(prefix="pandaweb-bench-") as root:
        backends = {
            mode: LocalBackend(engine_config(sandbox_dir=Path(root), local_namespaces=mode))
            for mode in modes
        }
        # A bound socket that never listens: nothing is loaded during the benchmark anyway, and
        # no stray request can leave the machine.
        with socket.socket() as dead:
            dead.bind(("127.0.0.1", 0))
            proxy_url = f"http://127.0.0.1:{dead.getsockname()[1]}"
            for i in range(args.runs + 1):
                for mode, backend in backends.items():
                    spec = SandboxSpec(
                        run_key=f"bench-{uuid.uuid4().hex[:8]}",
                        proxy_url=proxy_url,
                        ttl_seconds=60,
                    )
                    t0 = time.perf_counter()
                    sandbox = backend.create(spec)
                    t1 = time.perf_counter()
                    backend.destroy(sandbox)
                    t2 = time.perf_counter()
                    if i == 0:
                        continue
                    ready[mode].append(sandbox.ready_seconds)
                    wall[mode].append(t1 - t0)
                    destroy[mode].append(t2 - t1)

    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"local sandbox, {args.runs} runs each, {os.cpu_count()} CPUs, load average {load}")
    if not support.usable:
        print(f"namespaced: not measured, {support.reason}")
    for mode in modes:
        label = MODES[mode] + (f": {support.isolation}" if mode == "on" else "")
        print(f"\n{label}")
        print(f"  create → CDP answering: {summary(ready[mode])}")
        print(f"  create() wall time:     {summary(wall[mode])}")
        print(f"  destroy():              {summary(destroy[mode])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
