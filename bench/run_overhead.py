"""What recording costs: the demo workflow's first 13 steps, the runner against plain Playwright.

    .venv/bin/python bench/run_overhead.py [--runs 10] [--delays 0,100] [--scenarios demo,dense]
        [--profile]

Against one demo portal on loopback, behind one egress proxy, each measured run gets a fresh local
sandbox (its start is not timed; see bench/sandbox_start.py) and then does steps 1-13 of
workflows/examples/acme-pay-invoice.yaml (everything before the irreversible submit-payment) as:

  A  a bare Playwright script: connect_over_cdp to the sandbox, the same gotos, fills, clicks,
     extract, download and screenshot with plain locators, nothing recorded;
  B  the production runner, ``Runner(plan, sink).run(cdp_url)``, with observation, masked
     screenshot per step, and production's own sink (``sessions.services.writer.RunSink``: a writer
     thread calling ``run_record_step``, which draws overlay and thumbnail, on a migrated SQLite
     database in a temporary PANDAWEB_DATA_DIR);
  C  the script of A with Playwright's own tracing on: ``context.tracing.start(screenshots=True,
     snapshots=True)`` before the first step and ``context.tracing.stop(path=…)`` into a
     temporary file after the last, the evidence a Playwright user can have, and pays for.

The browser is the same executable for all three (``EngineConfig.chromium``, or
``find_chromium``'s choice). A and C get what a Playwright user has, a browser drawing on its own
clock: their sandboxes are built from the settings' engine config with ``begin_frame="off"``. B
gets the product's config as it stands (``PANDAWEB_BEGIN_FRAME``, default "auto": a headless
shell draws a page only when asked). The report names how each arm's browser drew.

All are timed from "sandbox answering CDP" to "done": Playwright start, CDP connect, the steps,
disconnect; for B the wait until the writer thread has persisted every step (``sink.close()``,
as ``run_execute`` does), for C starting the trace and writing it (``tracing.stop``). The arms
alternate (A, B, C, A, B, C ...) after one unmeasured warm-up triple. Each delay in --delays
(milliseconds added to every portal response, like a remote portal) is run for each scenario:
*demo* is the 13 steps above; *dense* is the same 13 steps followed by nine steps on the portal's
dense lab pages (a 1,000-row table with a checkbox and two buttons per row, a 300-card product
grid, a 400-link mega-menu; an assert, an extract, a satisfied wait_for and a screenshot among
them; ``_harness.dense_steps``). The report gives the medians of A, B and C side by side with
the ratios B/A (what recording costs against no evidence) and B/C (against Playwright's own
evidence), for the total and for the steps alone, and a per-step table of B's median step time.
--profile splits the runner's per-step time into act / observe (of which read: the
in-page serialisation and the change mark, ``Runtime.evaluate`` in the isolated world) /
screenshot / other, by wrapping those functions during the B runs. The numbered observation,
overlay and thumbnail are built by the sink's writer thread, off the runner's path, so they
show up only in the totals (and in the drain after the run).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _harness import (
    BareTiming,
    Persistence,
    Workflow,
    bare_run,
    demo_workflow,
    dense_steps,
    egress_proxy,
    load_line,
    portal,
    portal_host,
    sandbox,
    set_delay,
    setup_django,
    stats,
    temp_dir,
)

if TYPE_CHECKING:
    from sessions.engine.sandbox.local import LocalBackend

PHASES = ("act", "observe", "read", "screenshot", "other")


# Profiling ---------------------------------------------------------------------------------------


class Profile:
    """Seconds per (step index, phase), one dict per B run."""

    def __init__(self) -> None:
        self.runs: list[dict[tuple[int, str], float]] = []
        self.current: dict[tuple[int, str], float] = defaultdict(float)
        self.step = -1
        self.phase = ""

    def add(self, name: str, seconds: float) -> None:
        self.current[(self.step, name)] += seconds

    def finish_run(self) -> None:
        self.runs.append(dict(self.current))
        self.current = defaultdict(float)


PROFILE: Profile | None = None


def _timed(
    name: str, function: Callable[..., Any], *, capture_only: bool = False, sealed: bool = False
) -> Any:
    """``function``, its time added to ``name``; ``sealed`` (with ``capture_only``): what it
    calls is counted as part of it, not again on its own."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if PROFILE is None or (capture_only and PROFILE.phase != "capture"):
            return function(*args, **kwargs)
        t0 = time.perf_counter()
        if sealed:
            PROFILE.phase = "sealed"
        try:
            return function(*args, **kwargs)
        finally:
            if sealed:
                PROFILE.phase = "capture"
            PROFILE.add(name, time.perf_counter() - t0)

    return wrapper


def install_profiling() -> None:
    """Wrap the observation functions the runner calls, the isolated world's evaluate and
    Page.screenshot."""
    from playwright.sync_api import Page

    from sessions.engine import observation

    observation.take = _timed("observe", observation.take, capture_only=True)
    observation.PageWatch.mark = _timed(  # type: ignore[method-assign]
        "observe", observation.PageWatch.mark, capture_only=True
    )
    # Only the screenshot taken for the record counts here; a screenshot step's own picture is
    # part of "act" (the baseline takes it too). The record's picture is the watch's one
    # frame drawn with a screenshot (Page.captureScreenshot on a browser that draws on its own
    # clock); with fields to mask, the watch's masked picture (its box reads
    # included, so they are not "read"), or Playwright's masked one where the watch cannot
    # place the masks.
    Page.screenshot = _timed("screenshot", Page.screenshot, capture_only=True)  # type: ignore[method-assign]
    observation.PageWatch.screenshot = _timed(  # type: ignore[method-assign]
        "screenshot", observation.PageWatch.screenshot, capture_only=True
    )
    observation.PageWatch.masked_screenshot = _timed(  # type: ignore[method-assign]
        "screenshot", observation.PageWatch.masked_screenshot, capture_only=True, sealed=True
    )
    observation.PageWatch.evaluate = _timed(  # type: ignore[method-assign]
        "read", observation.PageWatch.evaluate, capture_only=True
    )


def profiled_runner_class() -> type[Any]:
    from sessions.engine import capturing
    from sessions.engine.runner import Runner

    class ProfiledRunner(Runner):
        def _execute(self, context: Any, index: int, step: Any) -> Any:
            assert PROFILE is not None
            PROFILE.step = index
            t0 = time.perf_counter()
            record = super()._execute(context, index, step)
            PROFILE.add("step", time.perf_counter() - t0)
            return record

        def _act(self, step: Any, record: Any, timeout: float) -> None:
            assert PROFILE is not None
            PROFILE.phase = "act"
            t0 = time.perf_counter()
            try:
                super()._act(step, record, timeout)
            finally:
                PROFILE.add("act", time.perf_counter() - t0)
                PROFILE.phase = ""

    # The runner captures through the module's function: the phase is set around it there,
    # once for the whole benchmark; the warm-up of the next scenario runs without a profile.
    capture = capturing.capture
    if getattr(capture, "profiled", False):
        return ProfiledRunner

    def capture_phase(runner: Any, record: Any, *, touched_page: bool, watch: bool = True) -> None:
        if PROFILE is None:
            capture(runner, record, touched_page=touched_page, watch=watch)
            return
        PROFILE.phase = "capture"
        try:
            capture(runner, record, touched_page=touched_page, watch=watch)
        finally:
            PROFILE.phase = ""

    capture_phase.profiled = True  # type: ignore[attr-defined]
    capturing.capture = capture_phase
    return ProfiledRunner


# The recorded run --------------------------------------------------------------------------------


class TimedSink:
    """Production's sink, noting when the runner handed over the last step."""

    def __init__(self, run_id: int) -> None:
        from sessions.services.writer import RunSink

        self.inner = RunSink(run_id)
        self.last_step_at = 0.0
        self.first_step_at = 0.0
        self.records: list[Any] = []

    def step_finished(self, record: Any) -> None:
        now = time.perf_counter()
        if not self.records:
            # The first record's own duration reaches back to when the step started.
            self.first_step_at = now - record.duration_ms / 1000
        self.last_step_at = now
        self.records.append(record)
        self.inner.step_finished(record)

    def action_starting(self, index: int) -> None:
        self.inner.action_starting(index)

    def action_finished(self, index: int, result: str = "") -> None:
        self.inner.action_finished(index, result)

    def action_refused(self, index: int, reason: str) -> None:
        self.inner.action_refused(index, reason)

    def stop_reason(self) -> str | None:
        return self.inner.stop_reason()

    def close(self) -> None:
        self.inner.close()


def recorded_run(
    cdp_url: str,
    workflow: Workflow,
    persistence: Persistence,
    files: Path,
    per_step: dict[int, list[float]] | None = None,
    *,
    artifacts_dir: str | None = None,
) -> dict[str, float]:
    from sessions.engine.plan import RunPlan
    from sessions.engine.runner import Runner

    run_id = persistence.new_run(workflow.inputs)
    plan = RunPlan(
        steps=workflow.steps,
        inputs=workflow.inputs,
        secrets=workflow.secrets,
        step_budget=40,
        deadline=time.time() + 600,
        artifacts_dir=files / str(run_id) / "artifacts",
    )
    runner_class = profiled_runner_class() if PROFILE is not None else Runner
    t0 = time.perf_counter()
    sink = TimedSink(run_id)
    outcome = runner_class(plan, sink).run(cdp_url, artifacts_dir=artifacts_dir)
    t1 = time.perf_counter()
    sink.close()
    t2 = time.perf_counter()
    if PROFILE is not None:
        PROFILE.finish_run()
    if outcome.status != "succeeded" or outcome.steps_executed != len(workflow.steps):
        raise RuntimeError(f"the recorded run did not succeed: {outcome}")
    counts = persistence.counts(run_id)
    if counts["steps"] != len(workflow.steps):
        raise RuntimeError(f"only {counts['steps']} steps were persisted")
    if per_step is not None:
        for record in sink.records:
            per_step[record.index].append(record.duration_ms / 1000)
    return {
        "total": t2 - t0,
        "runner": t1 - t0,
        "steps": sink.last_step_at - sink.first_step_at,
        "drain": t2 - t1,
    }


# Reporting ---------------------------------------------------------------------------------------


def row(label: str, values: list[float]) -> str:
    low, mid, high = stats(values)
    return f"  {label:<44} {low:7.3f} {mid:7.3f} {high:7.3f}"


def print_profile(profile: Profile, workflow: Workflow) -> None:
    runs = profile.runs
    print(f"\n  runner time per step, median of {len(runs)} runs (ms)")
    header = "".join(f"{p:>11}" for p in (*PHASES, "step"))
    print(f"  {'#':>2} {'step':<15}{header}")
    totals: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        per_run: dict[str, float] = defaultdict(float)
        for (_, name), seconds in run.items():
            per_run[name] += seconds
        for phase in (*PHASES, "step"):
            value = per_run["step"] - _accounted(per_run) if phase == "other" else per_run[phase]
            totals[phase].append(value)
    for index, step in enumerate(workflow.steps):
        cells = []
        for phase in (*PHASES, "step"):
            values = []
            for run in runs:
                if phase == "other":
                    parts = {p: run.get((index, p), 0.0) for p in (*PHASES, "step")}
                    values.append(parts["step"] - _accounted(parts))
                else:
                    values.append(run.get((index, phase), 0.0))
            cells.append(f"{statistics.median(values) * 1000:11.0f}")
        print(f"  {index + 1:>2} {step['id'][:15]:<15}{''.join(cells)}")
    all_cells = "".join(f"{statistics.median(totals[p]) * 1000:11.0f}" for p in (*PHASES, "step"))
    print(f"     {f'all {len(workflow.steps)} steps':<15}{all_cells}")
    step_total = statistics.median(totals["step"])
    shares = ", ".join(
        f"{p} {statistics.median(totals[p]) / step_total:.0%}" for p in PHASES if p != "read"
    )
    print(f"  shares of step time: {shares}")
    print(
        "  (observe = the change mark and observation.take: read = their Runtime.evaluate in"
        " the isolated world; other = settle, step validation and the sink hand-off)"
    )


def _accounted(parts: dict[str, float]) -> float:
    # "read" is part of "observe", so it is not subtracted again.
    return sum(parts.get(p, 0.0) for p in PHASES if p not in ("other", "read"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="measured runs per variant")
    parser.add_argument(
        "--delays", default="0,100", help="portal delays to test, ms per response (default 0,100)"
    )
    parser.add_argument(
        "--scenarios", default="demo,dense", help="demo, dense or both (default demo,dense)"
    )
    parser.add_argument("--profile", action="store_true", help="break the runner's time down")
    args = parser.parse_args()
    delays = [float(x) for x in args.delays.split(",") if x.strip()]
    scenarios = [x.strip() for x in args.scenarios.split(",") if x.strip()]

    print(f"start: {load_line()}")
    with (
        temp_dir("pandaweb-bench-data-") as data,
        temp_dir("pandaweb-bench-sandboxes-") as sandboxes,
        portal() as server,
    ):
        host = portal_host(server)
        workflow = demo_workflow(host)
        persistence = setup_django(workflow, Path(data))
        from django.conf import settings

        from sessions.engine.sandbox.local import LocalBackend

        files = Path(settings.RUN_FILES_DIR)
        product = replace(settings.ENGINE_CONFIG, sandbox_dir=Path(sandboxes))
        backends = Backends(
            # Only how the browser draws differs: same executable, same isolation.
            bare=LocalBackend(replace(product, begin_frame="off")),
            product=LocalBackend(product),
        )
        if args.profile:
            install_profiling()
        dense = Workflow(
            document=workflow.document,
            text=workflow.text,
            steps=[*workflow.steps, *dense_steps(host)],
            inputs=workflow.inputs,
            secrets=workflow.secrets,
            host=workflow.host,
        )
        with egress_proxy(host) as proxy:
            for delay in delays:
                for scenario in scenarios:
                    flow = dense if scenario == "dense" else workflow
                    set_delay(server, delay / 1000)
                    measure(scenario, delay, flow, args, backends, proxy, persistence, files)
    print(f"\nend: {load_line()}")
    return 0


@dataclass(frozen=True)
class Backends:
    bare: LocalBackend  # A and C: the browser on its own clock
    product: LocalBackend  # B: as the settings configure it


def bare_arm(
    backend: LocalBackend, proxy: Any, workflow: Workflow, *, dense: bool, traced: bool
) -> tuple[BareTiming, dict[str, Any]]:
    """A (or C, ``traced``) in a fresh sandbox; its timing and the sandbox's details."""
    with sandbox(backend, proxy) as box, temp_dir("pandaweb-bench-dl-") as dl:
        timing = bare_run(
            box.cdp_url,
            workflow,
            Path(dl),
            dense=dense,
            artifacts_dir=box.details.get("artifacts_dir"),
            trace=Path(dl) / "trace.zip" if traced else None,
        )
        return timing, box.details


def measure(
    scenario: str,
    delay: float,
    workflow: Workflow,
    args: argparse.Namespace,
    backends: Backends,
    proxy: Any,
    persistence: Persistence,
    files: Path,
) -> None:
    global PROFILE
    arms: dict[str, dict[str, list[float]]] = {arm: defaultdict(list) for arm in "ABC"}
    browsers: dict[str, set[tuple[str, str]]] = {arm: set() for arm in "ABC"}
    per_step: dict[int, list[float]] = defaultdict(list)
    dense = scenario == "dense"
    PROFILE = None
    for i in range(args.runs + 1):
        warm_up = i == 0
        bare, details = bare_arm(backends.bare, proxy, workflow, dense=dense, traced=False)
        browsers["A"].add((details["chromium"], details["frames"]))
        if args.profile and i == 1:
            PROFILE = Profile()
        with sandbox(backends.product, proxy) as box:
            result = recorded_run(
                box.cdp_url,
                workflow,
                persistence,
                files,
                None if warm_up else per_step,
                artifacts_dir=box.details.get("artifacts_dir"),
            )
            browsers["B"].add((box.details["chromium"], box.details["frames"]))
        traced, details = bare_arm(backends.bare, proxy, workflow, dense=dense, traced=True)
        browsers["C"].add((details["chromium"], details["frames"]))
        if not warm_up:
            arms["A"]["total"].append(bare.total)
            arms["A"]["steps"].append(bare.steps)
            for key, value in result.items():
                arms["B"][key].append(value)
            arms["C"]["total"].append(traced.total)
            arms["C"]["steps"].append(traced.steps)
            arms["C"]["trace_write"].append(traced.trace_write)
            arms["C"]["trace_mib"].append(traced.trace_bytes / 2**20)
        print(
            f"  {scenario}, delay {delay:g} ms, triple {i}{' (warm-up)' if warm_up else ''}: "
            f"A {bare.total:.2f} s, B {result['total']:.2f} s, C {traced.total:.2f} s",
            file=sys.stderr,
        )
    executables = {chromium for seen in browsers.values() for chromium, _ in seen}
    if len(executables) != 1:
        raise RuntimeError(f"the arms ran different browsers: {sorted(executables)}")
    report(scenario, delay, args.runs, arms, browsers)
    print(f"  B per step, median of {args.runs} runs (ms)")
    for index, step in enumerate(workflow.steps):
        values = per_step.get(index) or [0.0]
        print(
            f"  {index + 1:>3} {step['id'][:20]:<20} {step['type']:<11}"
            f" {statistics.median(values) * 1000:8.0f}"
        )
    if PROFILE is not None:
        print_profile(PROFILE, workflow)
        PROFILE = None


def report(
    scenario: str,
    delay: float,
    runs: int,
    arms: dict[str, dict[str, list[float]]],
    browsers: dict[str, set[tuple[str, str]]],
) -> None:
    a, b, c = arms["A"], arms["B"], arms["C"]
    print(
        f"\n{scenario} scenario, portal delay {delay:g} ms per response, {runs} runs per variant, "
        f"alternated A/B/C ({load_line()})"
    )
    for arm, seen in browsers.items():
        drawn = "; ".join(f"{chromium}, frames {frames}" for chromium, frames in sorted(seen))
        print(f"  {arm} browser: {drawn}")
    print(f"  {'seconds':<44} {'min':>7} {'median':>7} {'max':>7}")
    print(row("A bare Playwright, total", a["total"]))
    print(row("B runner + recording + persistence, total", b["total"]))
    print(row("C bare Playwright + tracing, total", c["total"]))
    print(row("A steps only (first step → last step)", a["steps"]))
    print(row("B steps only (first step → last record)", b["steps"]))
    print(row("C steps only (first step → last step)", c["steps"]))
    print(row("B Runner.run() returned", b["runner"]))
    print(row("B writer drain after the run (sink.close)", b["drain"]))
    print(row("C writing the trace (tracing.stop)", c["trace_write"]))
    print(row("C trace file (MiB)", c["trace_mib"]))
    print(f"  {'medians (s)':<20} {'A':>7} {'B':>7} {'C':>7} {'B/A':>7} {'B/C':>7}")
    for label, key in (("total", "total"), ("steps only", "steps")):
        ma, mb, mc = (statistics.median(arm[key]) for arm in (a, b, c))
        print(f"  {label:<20} {ma:7.3f} {mb:7.3f} {mc:7.3f} {mb / ma:6.2f}x {mb / mc:6.2f}x")


if __name__ == "__main__":
    raise SystemExit(main())
