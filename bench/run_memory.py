"""How much memory one run's browser takes: peak PSS (and RSS) of the sandbox's Chromium tree.

    .venv/bin/python bench/run_memory.py [--runs 3] [--interval 0.1]
    .venv/bin/python bench/run_memory.py --concurrent 1,5,10,20 [--interval 0.5]

For each run: the demo portal on loopback, the run's egress proxy, a fresh local sandbox, and the
production runner doing the whole demo workflow (workflows/examples/acme-pay-invoice.yaml; it
stops before the irreversible step 14, as a real run does) with full recording into an in-memory
sink (persistence happens in the worker process, not in the browser, so it is left out). A thread
samples every --interval seconds the sandbox's Chromium processes: the sandbox's process group,
plus Chromium's crash handler, which leaves the group (setsid) but carries the sandbox's workdir
on its command line. The sandbox watchdog (a small Python process) is reported separately.
PSS counts shared pages once across the tree, so it is the figure that adds up per sandbox; RSS
counts them in every process and is shown for reference.

With --concurrent, each N starts N sandboxes, then runs the demo workflow in all of them at once
(one runner thread each, every record built as the run's writer would: ``recording.finish``),
samples the sum of all the sandboxes' PSS, and prints its peak divided by N; every run must reach
step 14 with all 13 steps recorded (an observation and a screenshot each).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from _harness import (
    demo_workflow,
    egress_proxy,
    engine_config,
    load_line,
    portal,
    portal_host,
    sandbox,
    temp_dir,
)

MIB = 1024 * 1024
# PSS, RSS, process count, PSS by process type, process count by type.
Sample = tuple[int, int, int, Counter[str], Counter[str]]


def _kind(cmdline: list[str]) -> str:
    for arg in cmdline:
        if arg.startswith("--type="):
            return arg.removeprefix("--type=")
    if any("crashpad" in arg for arg in cmdline[:1]):
        return "crashpad-handler"
    return "browser"


@dataclass
class Peak:
    pss: int = 0
    rss: int = 0
    processes: int = 0
    samples: int = 0
    idle_pss: int = 0
    watchdog_pss: int = 0
    at_peak: Counter[str] = field(default_factory=Counter)
    kinds_at_peak: Counter[str] = field(default_factory=Counter)
    sample_seconds: list[float] = field(default_factory=list)


class Sampler:
    def __init__(self, pgid: int, workdir: str, watchdog_pid: int, interval: float) -> None:
        self.pgid = pgid
        self.workdir = workdir
        self.watchdog_pid = watchdog_pid
        self.interval = interval
        self.peak = Peak()
        self._outsiders: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pss-sampler", daemon=True)

    def _members(self, scan_cmdlines: bool) -> list[psutil.Process]:
        members = []
        for pid in psutil.pids():
            if pid == self.watchdog_pid:
                continue
            try:
                if os.getpgid(pid) == self.pgid:
                    members.append(psutil.Process(pid))
                    continue
            except OSError:
                continue
            if scan_cmdlines and pid not in self._outsiders:
                with contextlib.suppress(psutil.Error):
                    if any(self.workdir in arg for arg in psutil.Process(pid).cmdline()):
                        self._outsiders.add(pid)
        for pid in list(self._outsiders):
            with contextlib.suppress(psutil.Error):
                members.append(psutil.Process(pid))
        return members

    def sample(self, scan_cmdlines: bool = False) -> Sample:
        pss = rss = count = 0
        by_kind: Counter[str] = Counter()
        kinds: Counter[str] = Counter()
        for process in self._members(scan_cmdlines):
            try:
                info = process.memory_full_info()
                kind = _kind(process.cmdline())
            except psutil.Error:
                continue  # a renderer that exited between listing and reading
            pss += info.pss
            rss += info.rss
            count += 1
            by_kind[kind] += info.pss
            kinds[kind] += 1
        return pss, rss, count, by_kind, kinds

    def start(self) -> None:
        pss, _, _, _, _ = self.sample(scan_cmdlines=True)
        self.peak.idle_pss = pss
        with contextlib.suppress(psutil.Error):
            self.peak.watchdog_pss = psutil.Process(self.watchdog_pid).memory_full_info().pss
        self._thread.start()

    def stop(self) -> Peak:
        self._stop.set()
        self._thread.join(5)
        return self.peak

    def _loop(self) -> None:
        tick = 0
        while True:
            t0 = time.perf_counter()
            pss, rss, count, by_kind, kinds = self.sample(scan_cmdlines=tick % 10 == 0)
            self.peak.sample_seconds.append(time.perf_counter() - t0)
            tick += 1
            self.peak.samples += 1
            if pss > self.peak.pss:
                self.peak.pss = pss
                self.peak.at_peak = by_kind
                self.peak.kinds_at_peak = kinds
            self.peak.rss = max(self.peak.rss, rss)
            self.peak.processes = max(self.peak.processes, count)
            if self._stop.wait(max(0.0, self.interval - (time.perf_counter() - t0))):
                return


class MemorySink:
    def __init__(self) -> None:
        self.records: list[Any] = []
        self.actions: list[tuple[str, int]] = []

    def step_finished(self, record: Any) -> None:
        self.records.append(record)

    def action_starting(self, index: int) -> None:
        self.actions.append(("intent", index))

    def action_finished(self, index: int, result: str = "") -> None:
        self.actions.append(("completion", index))

    def action_refused(self, index: int, reason: str) -> None:
        self.actions.append(("refusal", index))

    def stop_reason(self) -> str | None:
        return None


def concurrent(counts: list[int], interval: float) -> None:
    from sessions.engine.sandbox.local import LocalBackend

    with (
        temp_dir("pandaweb-bench-sandboxes-") as sandboxes,
        temp_dir("pandaweb-bench-files-") as files,
        portal() as server,
    ):
        host = portal_host(server)
        workflow = demo_workflow(host, steps=None)
        backend = LocalBackend(engine_config(sandbox_dir=Path(sandboxes)))
        with egress_proxy(host) as proxy:
            for n in counts:
                at_once(n, workflow, backend, proxy, Path(files), interval)


def at_once(n: int, workflow: Any, backend: Any, proxy: Any, files: Path, interval: float) -> None:
    from sessions.engine import recording
    from sessions.engine.plan import RunPlan
    from sessions.engine.runner import Runner

    peak = [0]
    stop = threading.Event()
    results: list[tuple[Any, MemorySink]] = []
    errors: list[BaseException] = []

    def sample_all(samplers: list[Sampler]) -> None:
        tick = 0
        while not stop.is_set():
            total = sum(s.sample(scan_cmdlines=tick % 10 == 0)[0] for s in samplers)
            peak[0] = max(peak[0], total)
            tick += 1
            stop.wait(interval)

    def one(i: int, box: Any) -> None:
        plan = RunPlan(
            steps=workflow.steps,
            inputs=workflow.inputs,
            secrets=workflow.secrets,
            step_budget=40,
            deadline=time.time() + 900,
            artifacts_dir=files / f"{n}-{i}",
        )
        sink = MemorySink()
        try:
            outcome = Runner(plan, sink).run(
                box.cdp_url, artifacts_dir=box.details.get("artifacts_dir")
            )
            for record in sink.records:
                recording.finish(record)
            results.append((outcome, sink))
        except BaseException as exc:
            errors.append(exc)

    with contextlib.ExitStack() as stack:
        boxes = [stack.enter_context(sandbox(backend, proxy)) for _ in range(n)]
        samplers = [
            Sampler(b.pgid, b.workdir, int(b.details["watchdog_pid"]), interval) for b in boxes
        ]
        sampler_thread = threading.Thread(target=sample_all, args=(samplers,), daemon=True)
        sampler_thread.start()
        t0 = time.perf_counter()
        threads = [threading.Thread(target=one, args=(i, b)) for i, b in enumerate(boxes)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - t0
        stop.set()
        sampler_thread.join(30)
    complete = sum(
        1
        for outcome, sink in results
        if outcome.status == "approval_required"
        and len(sink.records) == 13
        and all(r.observation and r.screenshot for r in sink.records)
    )
    print(
        f"  N={n:>2}: peak total PSS {peak[0] / MIB:7.0f} MiB, {peak[0] / MIB / n:5.0f} MiB per "
        f"run; {complete}/{n} runs recorded completely, {len(errors)} errors; "
        f"wall {seconds:.1f} s ({load_line()})",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between samples")
    parser.add_argument("--concurrent", default="", help="run N at once, e.g. 1,5,10,20")
    args = parser.parse_args()
    if args.concurrent:
        print(f"start: {load_line()}")
        concurrent([int(x) for x in args.concurrent.split(",") if x.strip()], args.interval)
        print(f"end: {load_line()}")
        return 0

    from sessions.engine.plan import RunPlan
    from sessions.engine.runner import Runner
    from sessions.engine.sandbox.local import LocalBackend

    print(f"start: {load_line()}")
    peaks: list[Peak] = []
    with (
        temp_dir("pandaweb-bench-sandboxes-") as sandboxes,
        temp_dir("pandaweb-bench-files-") as files,
        portal() as server,
    ):
        host = portal_host(server)
        workflow = demo_workflow(host, steps=None)
        backend = LocalBackend(engine_config(sandbox_dir=Path(sandboxes)))
        with egress_proxy(host) as proxy:
            for i in range(args.runs):
                with sandbox(backend, proxy) as box:
                    sampler = Sampler(
                        box.pgid, box.workdir, int(box.details["watchdog_pid"]), args.interval
                    )
                    sampler.start()
                    plan = RunPlan(
                        steps=workflow.steps,
                        inputs=workflow.inputs,
                        secrets=workflow.secrets,
                        step_budget=40,
                        deadline=time.time() + 600,
                        artifacts_dir=Path(files) / str(i),
                    )
                    sink = MemorySink()
                    t0 = time.perf_counter()
                    outcome = Runner(plan, sink).run(
                        box.cdp_url, artifacts_dir=box.details.get("artifacts_dir")
                    )
                    seconds = time.perf_counter() - t0
                    peak = sampler.stop()
                if outcome.status != "approval_required" or outcome.steps_executed != 13:
                    raise RuntimeError(f"the run did not reach step 14: {outcome}")
                peaks.append(peak)
                print(
                    f"  run {i + 1}: {outcome.steps_executed} steps in {seconds:.1f} s, "
                    f"{peak.samples} samples, peak PSS {peak.pss / MIB:.0f} MiB"
                )

    print(f"\nbrowser process tree of one run, {args.runs} runs ({load_line()})")
    print(f"  {'':<36} {'min':>8} {'median':>8} {'max':>8}")
    for label, values in (
        ("idle PSS after start (MiB)", [p.idle_pss / MIB for p in peaks]),
        ("peak PSS during the run (MiB)", [p.pss / MIB for p in peaks]),
        ("peak RSS, for reference (MiB)", [p.rss / MIB for p in peaks]),
        ("processes (most at once)", [float(p.processes) for p in peaks]),
        ("watchdog PSS, not included (MiB)", [p.watchdog_pss / MIB for p in peaks]),
    ):
        print(
            f"  {label:<36} {min(values):8.1f} {statistics.median(values):8.1f} {max(values):8.1f}"
        )
    worst = max(peaks, key=lambda p: p.pss)
    print("  at the highest peak, by process type:")
    for kind, pss in worst.at_peak.most_common():
        print(f"    {kind:<34} {worst.kinds_at_peak[kind]:>2} x  {pss / MIB:7.1f} MiB PSS")
    durations = [s for p in peaks for s in p.sample_seconds]
    print(
        f"  one sample took median {statistics.median(durations) * 1000:.0f} ms, "
        f"max {max(durations) * 1000:.0f} ms (interval {args.interval * 1000:.0f} ms)"
    )
    target = "within" if worst.pss <= 300 * MIB else "ABOVE"
    print(f"  highest peak PSS {worst.pss / MIB:.0f} MiB: {target} the 300 MiB target")
    print(f"\nend: {load_line()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
