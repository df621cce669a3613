"""Local vs namespaced local vs microVM: start-up, memory per run, the demo workflow's wall time.

    .venv/bin/python bench/isolation.py                    # everything (about 15 min under TCG)
    .venv/bin/python bench/isolation.py --starts 10 --cold 3 --workflow 0

Time to CDP ready (median / p95) for: the plain local backend (process group only), the
namespaced local backend, a microVM cold boot, a microVM restored from the base snapshot and a
microVM forked from a session template (a VM saved after logging in to the demo portal). Then
RSS and PSS of one run's processes after it loaded a portal page, and the demo workflow's wall
time up to its irreversible step on each. Forked runs skip the login steps entirely (their
browser wakes up logged in); the download step is left out on every backend alike, because a
microVM's downloads stay inside the guest. Needs the guest image (`scripts/setup-microvm`).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from _harness import (
    BEFORE_PAYING,
    demo_workflow,
    egress_proxy,
    engine_config,
    load_line,
    portal,
    portal_host,
    temp_dir,
)

from sessions.engine.plan import RunPlan, SessionCheck
from sessions.engine.runner import Runner
from sessions.engine.sandbox.base import Sandbox, SandboxSpec
from sessions.engine.sandbox.local import LocalBackend
from sessions.engine.sandbox.microvm.backend import MicroVMBackend

MIB = 1024 * 1024
LOGIN_STEPS = ("open-login", "log-in", "wait-dashboard")


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"median {statistics.median(ordered):7.3f}  p95 {p95:7.3f}  (s, n={len(ordered)})"


def spec(proxy_url: str, restore_from: str = "") -> SandboxSpec:
    return SandboxSpec(
        run_key=f"bench-{uuid.uuid4().hex[:8]}",
        proxy_url=proxy_url,
        ttl_seconds=1800,
        restore_from=restore_from,
    )


def processes_of(sandbox: Sandbox) -> list[psutil.Process]:
    """Every process of one run's sandbox, without its watchdog (a few MiB of Python)."""
    watchdog = sandbox.details.get("watchdog_pid")
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            line = " ".join(process.info["cmdline"] or [])
        except psutil.NoSuchProcess:
            continue
        if sandbox.workdir in line and process.pid != watchdog:
            found.append(process)
    return found


def memory(sandbox: Sandbox) -> tuple[float, float]:
    rss = pss = 0.0
    for process in processes_of(sandbox):
        try:
            info = process.memory_full_info()
        except psutil.NoSuchProcess:
            continue
        rss += info.rss
        pss += info.pss
    return rss / MIB, pss / MIB


class Sink:
    def __init__(self) -> None:
        self.records: list[Any] = []

    def step_finished(self, record: Any) -> None:
        self.records.append(record)

    def action_starting(self, index: int) -> None:
        raise AssertionError("the benchmark never approves an action")

    def action_finished(self, index: int, result: str = "") -> None:
        raise AssertionError("the benchmark never approves an action")

    def action_refused(self, index: int, reason: str) -> None:
        raise AssertionError("the benchmark never approves an action")

    def stop_reason(self) -> str | None:
        return None


def run_steps(sandbox: Sandbox, steps: list[dict[str, Any]], workflow: Any, **plan: Any) -> Any:
    with tempfile.TemporaryDirectory(prefix="pandaweb-bench-files-") as files:
        outcome = Runner(
            RunPlan(
                steps=steps,
                inputs=workflow.inputs,
                secrets=workflow.secrets,
                step_budget=40,
                deadline=time.time() + 1800,
                artifacts_dir=Path(files),
                time_scale=float(sandbox.details.get("time_scale", 1.0)),
                **plan,
            ),
            Sink(),
        ).run(sandbox.cdp_url, artifacts_dir=sandbox.details.get("artifacts_dir"))
    return outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=10, help="starts per variant")
    parser.add_argument("--cold", type=int, default=10, help="microVM cold boots (~20 s each)")
    parser.add_argument("--workflow", type=int, default=1, help="demo workflow runs per variant")
    args = parser.parse_args()

    print(f"start: {load_line()}")
    with temp_dir("pandaweb-bench-sandboxes-") as root, portal() as server:
        host = portal_host(server)
        workflow = demo_workflow(host, steps=BEFORE_PAYING)
        steps = [s for s in workflow.steps if s["type"] != "download"]
        check = SessionCheck(url=f"http://{host}/", logged_in={"text": "Open invoices"})
        login = [s for s in steps if s["id"] in LOGIN_STEPS]
        after_login = [s for s in steps if s["id"] not in LOGIN_STEPS]
        plain = LocalBackend(engine_config(sandbox_dir=Path(root), local_namespaces="off"))
        namespaced = LocalBackend(engine_config(sandbox_dir=Path(root), local_namespaces="on"))
        microvm = MicroVMBackend(engine_config(sandbox_dir=Path(root), microvm_pool=0))
        cold = MicroVMBackend(engine_config(sandbox_dir=Path(root), microvm_pool=0), restore=False)
        print(f"microVM accelerator: {microvm.accelerator.label} ({microvm.accelerator.reason})")

        with egress_proxy(host) as proxy:
            # The template the forks start from: log in once in a microVM, check, save it.
            baker = microvm.create(spec(proxy.url))
            baked = run_steps(baker, login, workflow, session=check, baking=True)
            if baked.status != "succeeded":
                raise RuntimeError(f"baking the session template failed: {baked.reason}")
            template = Path(root) / "template.state"
            microvm.snapshot(baker, template)
            # The local backend's template: the cookies a bake captures.
            local_baker = namespaced.create(spec(proxy.url))
            local_state = run_steps(
                local_baker, login, workflow, session=check, baking=True, capture_state=True
            ).storage_state
            namespaced.destroy(local_baker)

            variants: dict[str, tuple[Callable[[], Sandbox], Any, int]] = {
                "local, process group": (lambda: plain.create(spec(proxy.url)), plain, args.starts),
                "local, namespaces": (
                    lambda: namespaced.create(spec(proxy.url)),
                    namespaced,
                    args.starts,
                ),
                "microVM, cold boot": (lambda: cold.create(spec(proxy.url)), cold, args.cold),
                "microVM, snapshot restore": (
                    lambda: microvm.create(spec(proxy.url)),
                    microvm,
                    args.starts,
                ),
                "microVM, template fork": (
                    lambda: microvm.create(spec(proxy.url, str(template))),
                    microvm,
                    args.starts,
                ),
            }
            ready: dict[str, list[float]] = {}
            mem: dict[str, tuple[float, float]] = {}
            for name, (make, backend, count) in variants.items():
                ready[name] = []
                for i in range(count):
                    sandbox = make()
                    ready[name].append(sandbox.ready_seconds)
                    if i == 0:
                        run_steps(sandbox, [{"id": "page", "type": "goto",
                                             "url": f"http://{host}/login"}], workflow)  # fmt: skip
                        mem[name] = memory(sandbox)
                    backend.destroy(sandbox)
                print(f"  {name:<28} ready {summary(ready[name])}")

            walls: dict[str, list[float]] = {}
            runs: dict[str, tuple[Callable[[], Sandbox], Any, dict[str, Any], list[Any]]] = {
                "local, process group": (lambda: plain.create(spec(proxy.url)), plain, {}, steps),
                "local, namespaces": (
                    lambda: namespaced.create(spec(proxy.url)),
                    namespaced,
                    {},
                    steps,
                ),
                "local, namespaces, fork": (
                    lambda: namespaced.create(spec(proxy.url)),
                    namespaced,
                    {"session": check, "storage_state": local_state},
                    after_login,
                ),
                "microVM, snapshot restore": (
                    lambda: microvm.create(spec(proxy.url)),
                    microvm,
                    {},
                    steps,
                ),
                "microVM, template fork": (
                    lambda: microvm.create(spec(proxy.url, str(template))),
                    microvm,
                    {"session": check},
                    after_login,
                ),
            }
            for name, (make, backend, plan, to_run) in runs.items():
                walls[name] = []
                for _ in range(args.workflow):
                    t0 = time.perf_counter()
                    sandbox = make()
                    outcome = run_steps(sandbox, to_run, workflow, **plan)
                    backend.destroy(sandbox)
                    if outcome.status != "succeeded":
                        raise RuntimeError(f"{name}: the workflow failed: {outcome.reason}")
                    walls[name].append(time.perf_counter() - t0)
                print(f"  {name:<28} workflow {summary(walls[name])}")

    print(f"\ntime to CDP ready ({load_line()})")
    for name, values in ready.items():
        print(f"  {name:<28} {summary(values)}")
    print("\nmemory of one run's processes after loading one portal page (MiB)")
    for name, (rss, pss) in mem.items():
        print(f"  {name:<28} RSS {rss:7.0f}  PSS {pss:7.0f}")
    print(f"\ndemo workflow before its irreversible step, start included ({len(steps)} steps;")
    print(f"forks skip the {len(login)} login steps)")
    for name, values in walls.items():
        print(f"  {name:<28} {summary(values)}")
    print(f"\nend: {load_line()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
