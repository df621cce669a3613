"""N runs at once, V websocket viewers each: all succeed, no event lost, step-event latency from
record to viewer, wall time against one run alone x N; scale-out stack, then the embedded default.

    .venv/bin/python bench/concurrency.py [--runs 20] [--viewers 5] [--mode both|scale-out|embedded]

Each mode starts its own stack on loopback, serves it with daphne (the real ASGI application, as
``manage.py up`` does) on a port the OS picked, and runs the whole demo workflow
(workflows/examples/acme-pay-invoice.yaml, its run limit raised to N and its time limit to 30
minutes) against the demo portal:

- *scale-out*: a scratch PostgreSQL database ``pandaweb_bench_hconc_<pid>``, Redis (``--redis-url``,
  emptied before and after: it must be a database of its own), ``--workers`` Celery worker
  processes with the threads pool, ⌈N / workers⌉ threads each, on the shared queue and this host's
  (continuations). Threads, because a run's worker mostly waits on its browser; two processes,
  because the recording a worker builds (observation, masks, thumbnail) is Python work under one
  GIL per process, and the machine has two cores.
- *embedded*: SQLite, the in-memory channel layer, runs in threads of the daphne process
  (``PANDAWEB_RUN_THREADS``, N by default: the default of 4 would queue the rest).

First one run alone, then N at once, in the same invocation. Runs are launched through the HTTP
API (``POST /api/v1/runs/``, an operator's token); for each, V viewers open
``/ws/runs/<id>/?after=0`` as logged-in users (each its own session cookie, made by signing in at
``/login/``, and the dashboard's Origin) and read every message. When a run waits at its
irreversible step, a second user (a reviewer's token) approves it through the API, which calls
``approval_decide`` in the dashboard process, so every run goes on to the payment and finishes.

Printed per mode: runs succeeded; events lost (every viewer must get every event of its run: the
sequence numbers contiguous from 1 to the run's last, none twice, every step's event among them);
p50/p95 step-event latency — from the event row's own timestamp (``RunEvent.created_at``, taken
when the writer inserts it, inside the step's transaction) to the viewer receiving the message,
counted only for events written after that viewer connected (earlier ones arrive as replay); wall
time of the N (first launch to last finish, from the rows) against the lone run's x N; the CPUs and
the load average at start and end. Every process, sandbox, scratch database and data directory is
removed at the end, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from _harness import (
    ROOT,
    demo_workflow,
    drop_database,
    free_port,
    load_line,
    portal,
    portal_host,
    scratch_database,
    start_worker,
    wait_for,
)

from pandaweb.supervisor import dashboard_argv

MODES = ("scale-out", "embedded")


@dataclass
class Viewer:
    run_id: int
    cookie: str
    opened: float = 0.0  # when the handshake completed (time.time())
    got: list[tuple[int, float]] = field(default_factory=list)  # (seq, received at)
    target: int | None = None  # the run's last seq, once the run is over
    error: str = ""

    @property
    def last(self) -> int:
        return max((seq for seq, _ in self.got), default=0)


@dataclass
class Stack:
    base: str  # http://127.0.0.1:<port>
    operator_token: str
    reviewer_token: str
    viewer_cookies: list[str]
    cookie_name: str
    slug: str
    server: Any  # the demo portal
    db: ThreadPoolExecutor  # one thread for the benchmark's own reads of the database


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# One phase: n runs at once, viewers on each, approvals decided as they come -------------------


def _read_state(run_ids: list[int]) -> dict[int, tuple[str, int | None, str]]:
    """Each run's status and, when it waits at its gate, its pending approval and evidence."""
    from approvals.models import ApprovalRequest
    from sessions.models import Run

    state: dict[int, tuple[str, int | None, str]] = {
        pk: (status, None, "")
        for pk, status in Run.objects.filter(pk__in=run_ids).values_list("pk", "status")
    }
    waiting = [pk for pk, (status, _, _) in state.items() if status == Run.Status.AWAITING_APPROVAL]
    for run_id, pk, sha in ApprovalRequest.objects.filter(
        run_id__in=waiting, status=ApprovalRequest.Status.PENDING
    ).values_list("run_id", "pk", "evidence_sha256"):
        state[run_id] = (state[run_id][0], pk, sha)
    return state


def _read_outcome(
    run_ids: list[int],
) -> tuple[dict[int, dict[str, Any]], dict[int, dict[int, Any]]]:
    from django.db import connections

    from pandaweb.audit.models import AuditEvent
    from sessions.models import Run, RunEvent

    runs: dict[int, dict[str, Any]] = {
        row["pk"]: dict(row)
        for row in Run.objects.filter(pk__in=run_ids).values(
            "pk", "status", "created_at", "finished_at", "last_event_seq", "failure_reason"
        )
    }
    # The step's audit row is the last write of the step's transaction: how long the
    # transaction went on after the event row, the part of the latency before the commit.
    audited = {
        (run_id, (after or {}).get("index")): at.timestamp()
        for run_id, after, at in AuditEvent.objects.filter(
            run_id__in=run_ids, action="run.step_executed"
        ).values_list("run_id", "after", "occurred_at")
    }
    events: dict[int, dict[int, Any]] = {pk: {} for pk in run_ids}
    for run_id, seq, kind, payload, created in RunEvent.objects.filter(
        run_id__in=run_ids
    ).values_list("run_id", "seq", "type", "payload", "created_at"):
        audit_at = audited.get((run_id, payload.get("index"))) if kind == "step" else None
        events[run_id][seq] = (kind, created.timestamp(), audit_at)
    connections.close_all()
    return runs, events


def _consumer_cost(run_id: int, username: str) -> dict[str, float]:
    """What ``RunConsumer`` does for one viewer and one message (its permission check, then the
    read and render of ``_messages_after``), repeated here on each event of a finished run: the
    median time and the queries, for the first viewer of an event (who renders what all share)
    and for another viewer of it right after."""
    from django.contrib.auth import get_user_model
    from django.db import connection, connections
    from django.test.utils import CaptureQueriesContext

    from pandaweb.core.permissions import user_can
    from pandaweb.core.roles import Capability
    from sessions.rendering import Viewer, messages_for
    from sessions.selectors import run_events_after

    users = get_user_model().objects

    def one_viewer(seq: int) -> tuple[float, int, int]:
        with CaptureQueriesContext(connection) as captured:
            t0 = time.perf_counter()
            user_can(users.get(username=username), Capability.VIEW_RUNS)
            viewer = Viewer.of(users.get(username=username))
            events = list(run_events_after(run_id, seq - 1, limit=1))
            text = json.dumps(messages_for(run_id, events, viewer))
            seconds = time.perf_counter() - t0
        return seconds, len(captured), len(text)

    first: list[tuple[float, int, int]] = []
    further: list[tuple[float, int, int]] = []
    last = max(e.seq for e in run_events_after(run_id, 0))
    for seq in range(1, last + 1):
        first.append(one_viewer(seq))  # renders what the viewers of this event share
        further.append(one_viewer(seq))  # another viewer of it, within SHARED_RENDER_SECONDS
    connections.close_all()
    return {
        "ms": statistics.median(s for s, _, _ in first) * 1000,
        "queries": statistics.median(q for _, q, _ in first),
        "bytes": statistics.median(b for _, _, b in first),
        "further_ms": statistics.median(s for s, _, _ in further) * 1000,
        "further_queries": statistics.median(q for _, q, _ in further),
    }


async def _watch(http: Any, stack: Stack, viewer: Viewer) -> None:
    import aiohttp

    origin = stack.base
    url = f"{stack.base.replace('http', 'ws', 1)}/ws/runs/{viewer.run_id}/?after=0"
    headers = {"Origin": origin, "Cookie": f"{stack.cookie_name}={viewer.cookie}"}
    try:
        async with http.ws_connect(url, headers=headers, max_msg_size=0) as ws:
            viewer.opened = time.time()
            while viewer.target is None or viewer.last < viewer.target:
                try:
                    message = await ws.receive(timeout=0.5)
                except TimeoutError:
                    continue
                if message.type == aiohttp.WSMsgType.TEXT:
                    received = time.time()
                    viewer.got.append((json.loads(message.data)["seq"], received))
                elif message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                    viewer.error = f"closed by the server ({ws.close_code})"
                    return
                elif message.type == aiohttp.WSMsgType.ERROR:
                    viewer.error = f"error: {ws.exception()}"
                    return
    except aiohttp.ClientError as exc:
        viewer.error = f"{type(exc).__name__}: {exc}"


async def _launch(http: Any, stack: Stack, invoice: Any) -> int:
    response = await http.post(
        f"{stack.base}/api/v1/runs/",
        json={
            "workflow": stack.slug,
            "inputs": {"invoice": invoice.number, "amount": f"{invoice.amount_due:.2f}"},
        },
        headers={"Authorization": f"Bearer {stack.operator_token}"},
    )
    body = (
        await response.json(content_type=None) if response.status < 500 else await response.text()
    )
    if response.status != 201:
        raise RuntimeError(f"the launch was refused ({response.status}): {body}")
    return int(body["id"])


async def _approve(http: Any, stack: Stack, approval_id: int, sha: str) -> None:
    response = await http.post(
        f"{stack.base}/api/v1/approvals/{approval_id}/decision",
        json={"verdict": "approve", "evidence_sha256": sha, "reason": "bench"},
        headers={"Authorization": f"Bearer {stack.reviewer_token}"},
    )
    if response.status != 200:
        text = await response.text()
        raise RuntimeError(f"approval {approval_id} refused ({response.status}): {text}")


async def phase(stack: Stack, n: int, viewers_per_run: int, timeout: float) -> dict[str, Any]:
    import aiohttp

    from sessions.models import Run

    loop = asyncio.get_running_loop()
    stack.server.state.reset()
    invoices = [i for i in stack.server.state.invoices() if i.status == "open"]
    if len(invoices) < n:
        raise SystemExit(f"the demo portal has {len(invoices)} open invoices, fewer than {n} runs")
    viewers: list[Viewer] = []
    watching: list[asyncio.Task[None]] = []
    connector = aiohttp.TCPConnector(limit=0)  # a websocket holds its connection
    async with aiohttp.ClientSession(connector=connector) as http:

        async def launch_and_watch(invoice: Any) -> int:
            run_id = await _launch(http, stack, invoice)
            for index in range(viewers_per_run):
                viewer = Viewer(run_id, stack.viewer_cookies[index % len(stack.viewer_cookies)])
                viewers.append(viewer)
                watching.append(asyncio.create_task(_watch(http, stack, viewer)))
            return run_id

        try:
            run_ids = list(await asyncio.gather(*(launch_and_watch(i) for i in invoices[:n])))
            decided: set[int] = set()
            deciding: list[asyncio.Task[None]] = []
            deadline = time.monotonic() + timeout
            while True:
                state = await loop.run_in_executor(stack.db, _read_state, run_ids)
                for _status, approval_id, sha in state.values():
                    if approval_id is not None and approval_id not in decided:
                        decided.add(approval_id)
                        deciding.append(
                            asyncio.create_task(_approve(http, stack, approval_id, sha))
                        )
                for task in deciding:
                    if task.done() and task.exception() is not None:
                        raise SystemExit(str(task.exception()))
                if all(status in Run.FINAL for status, _, _ in state.values()):
                    break
                if time.monotonic() > deadline:
                    counts: dict[str, int] = {}
                    for status, _, _ in state.values():
                        counts[status] = counts.get(status, 0) + 1
                    raise SystemExit(f"runs not finished after {timeout:.0f} s: {counts}")
                await asyncio.sleep(0.05)
            await asyncio.gather(*deciding)
            runs, events = await loop.run_in_executor(stack.db, _read_outcome, run_ids)
            for viewer in viewers:
                viewer.target = runs[viewer.run_id]["last_event_seq"]
            # Every event is in the database before its message is sent: give the viewers time
            # to read the last ones, then count what each has.
            await asyncio.wait(watching, timeout=60)
        finally:
            for task in watching:
                task.cancel()
            await asyncio.gather(*watching, return_exceptions=True)
    return summarize(n, viewers_per_run, runs, events, viewers)


def summarize(
    n: int,
    viewers_per_run: int,
    runs: dict[int, dict[str, Any]],
    events: dict[int, dict[int, Any]],
    viewers: list[Viewer],
) -> dict[str, Any]:
    lost = duplicated = gaps = steps_missed = 0
    latencies: list[float] = []
    errors = [v.error for v in viewers if v.error]
    for viewer in viewers:
        run_events = events[viewer.run_id]
        seqs = [seq for seq, _ in viewer.got]
        expected = set(range(1, runs[viewer.run_id]["last_event_seq"] + 1))
        lost += len(expected - set(seqs))
        duplicated += len(seqs) - len(set(seqs))
        if seqs and seqs != list(range(seqs[0], seqs[0] + len(seqs))):
            gaps += 1
        step_seqs = {seq for seq, (kind, _, _) in run_events.items() if kind == "step"}
        steps_missed += len(step_seqs - set(seqs))
        for seq, received in viewer.got:
            kind, created, _ = run_events[seq]
            if kind == "step" and created >= viewer.opened:
                latencies.append(received - created)
    started = min(r["created_at"] for r in runs.values())
    finished = [r["finished_at"] for r in runs.values() if r["finished_at"] is not None]
    statuses: dict[str, int] = {}
    for r in runs.values():
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    steps = [sum(1 for kind, _, _ in events[pk].values() if kind == "step") for pk in runs]
    tails = [
        audit_at - created
        for run_events in events.values()
        for kind, created, audit_at in run_events.values()
        if kind == "step" and audit_at is not None
    ]
    return {
        "run_ids": sorted(runs),
        "runs": n,
        "succeeded": statuses.get("succeeded", 0),
        "statuses": statuses,
        "failures": sorted({r["failure_reason"] for r in runs.values() if r["failure_reason"]}),
        "viewers": len(viewers),
        "viewers_per_run": viewers_per_run,
        "events": sum(len(e) for e in events.values()),
        "step_events": sum(steps),
        "steps_per_run": sorted(set(steps)),
        "lost": lost,
        "duplicated": duplicated,
        "viewers_with_gaps": gaps,
        "step_events_missed": steps_missed,
        "viewer_errors": errors[:5],
        "viewer_error_count": len(errors),
        "latency_samples": len(latencies),
        "p50_ms": statistics.median(latencies) * 1000 if latencies else math.nan,
        "p95_ms": percentile(latencies, 0.95) * 1000 if latencies else math.nan,
        "max_ms": max(latencies) * 1000 if latencies else math.nan,
        "tx_p50_ms": statistics.median(tails) * 1000 if tails else math.nan,
        "tx_p95_ms": percentile(tails, 0.95) * 1000 if tails else math.nan,
        "wall_s": (max(finished) - started).total_seconds() if finished else math.nan,
    }


# One mode: its stack, one run alone, then N at once ------------------------------------------


def _login(base: str, username: str, password: str, cookie_name: str) -> str:
    import requests

    with requests.Session() as session:
        page = session.get(f"{base}/login/", timeout=30)
        match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        if match is None:
            raise SystemExit("the login page has no CSRF token")
        answer = session.post(
            f"{base}/login/",
            data={"username": username, "password": password, "csrfmiddlewaretoken": match[1]},
            headers={"Origin": base, "Referer": f"{base}/login/"},
            timeout=30,
        )
        cookie = session.cookies.get(cookie_name)
        if answer.status_code != 200 or not cookie or "/login/" in answer.url:
            raise SystemExit(f"{username} could not sign in ({answer.status_code} {answer.url})")
        return str(cookie)


def _answers(url: str) -> bool:
    import requests

    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def one_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    start_load = load_line()
    print(f"[{mode}] start: {start_load}", flush=True)
    with contextlib.ExitStack() as cleanup:
        data_dir = Path(tempfile.mkdtemp(prefix=f"pandaweb-bench-hconc-{mode}-"))
        cleanup.callback(shutil.rmtree, data_dir, ignore_errors=True)
        healthy = [False]

        def keep_logs() -> None:
            # The data directory goes with the rest: keep the processes' logs to read.
            if healthy[0]:
                return
            kept = Path(tempfile.mkdtemp(prefix=f"pandaweb-bench-hconc-logs-{mode}-"))
            for log in data_dir.glob("*.log"):
                shutil.copy(log, kept / log.name)
            print(f"[{mode}] something failed: the logs are kept in {kept}", flush=True)

        cleanup.callback(keep_logs)
        sandbox_dir = data_dir / "sandboxes"
        # daphne cannot adopt a listening socket (twisted has no "fd:" server endpoint): the OS
        # picks a free port, which daphne then binds.
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        env = {
            **os.environ,
            "PANDAWEB_DATA_DIR": str(data_dir),
            "PANDAWEB_SANDBOX_DIR": str(sandbox_dir),
            # The dashboard's own origins (websockets) follow the port, as with `manage.py up`.
            "PANDAWEB_PORT": str(port),
            # Launches and decisions of 20 runs at once are far below it; only a safety margin.
            "PANDAWEB_API_RATE_LIMIT": "100000",
            "DJANGO_SETTINGS_MODULE": "pandaweb.settings",
        }
        for name in (
            "DATABASE_URL",
            "REDIS_URL",
            "PANDAWEB_RUN_EXECUTION",
            "PANDAWEB_RUN_FILES_DIR",
        ):
            env.pop(name, None)
        if mode == "scale-out":
            import redis

            database_url, handle = scratch_database(
                args.database_url, f"pandaweb_bench_hconc_{os.getpid()}"
            )
            cleanup.callback(drop_database, handle)
            env["DATABASE_URL"] = database_url
            env["REDIS_URL"] = args.redis_url
            broker = redis.Redis.from_url(args.redis_url)
            broker.flushdb()  # no task queued by an earlier, interrupted benchmark
            cleanup.callback(broker.close)
            cleanup.callback(broker.flushdb)
            per_worker = max(2, math.ceil(args.runs / args.workers))
            layout = (
                f"PostgreSQL, Redis, {args.workers} Celery worker processes × {per_worker} "
                "threads (pool=threads)"
            )
        else:
            threads = args.embedded_threads or args.runs
            env["PANDAWEB_RUN_THREADS"] = str(threads)
            layout = (
                f"SQLite, in-memory channel layer, runs in {threads} threads of the daphne process"
            )
        os.environ.clear()
        os.environ.update(env)
        import django

        from pandaweb.localfiles import ensure_local_files

        ensure_local_files()
        django.setup()
        import logging

        from django.conf import settings
        from django.contrib.auth.models import Group, User
        from django.core.management import call_command
        from django.db import connections

        from pandaweb.api.services import token_create
        from pandaweb.core.roles import Role
        from pandaweb.core.services import roles_sync
        from sessions.engine.sandbox.local import reap_orphans
        from workflows import services as workflows

        cleanup.callback(connections.close_all)
        logging.getLogger("pandaweb.demo_portal.server").setLevel(logging.WARNING)
        call_command("migrate", verbosity=0)
        roles_sync()

        def user(name: str, role: Role) -> tuple[Any, str]:
            password = uuid.uuid4().hex
            account = User.objects.create_user(name, password=password)
            account.groups.add(Group.objects.get(name=role.value))
            return account, password

        operator, _ = user("bench-operator", Role.OPERATORS)
        reviewer, _ = user("bench-reviewer", Role.REVIEWERS)
        viewer_logins = [user(f"bench-viewer-{i + 1}", Role.OPERATORS) for i in range(args.viewers)]
        _, operator_token = token_create(
            actor=operator, owner=operator, name="bench", scopes=["runs:launch", "runs:read"],
            expires_at=None,
        )  # fmt: skip
        _, reviewer_token = token_create(
            actor=reviewer, owner=reviewer, name="bench",
            scopes=["approvals:read", "approvals:decide"], expires_at=None,
        )  # fmt: skip
        server = cleanup.enter_context(portal())
        workflow = demo_workflow(portal_host(server), steps=None)
        document = yaml.safe_load(workflow.text)
        document["settings"]["max_concurrent_runs"] = max(3, args.runs)
        # A bound only, never reached when things go well; 2 CPUs running 20 browsers are slow.
        document["settings"]["run_ttl_minutes"] = 30
        workflows.credential_create(
            user=operator, name="acme-portal", kind="username_password", description="",
            values=dict(workflow.secrets["acme-portal"]),
        )  # fmt: skip
        imported = workflows.workflow_import(
            user=operator, text=yaml.safe_dump(document, sort_keys=False)
        )
        workflows.workflow_publish(
            workflow_id=imported.pk, user=operator, message="bench", accept_warnings=True
        )
        connections.close_all()

        # Last registered, first run: the processes stop, then their sandboxes go.
        cleanup.callback(lambda: reap_orphans(sandbox_dir, now=math.inf))
        if mode == "scale-out":
            for index in range(args.workers):
                worker = start_worker(
                    env, data_dir / f"worker{index + 1}.log", name=f"hconc{index + 1}",
                    concurrency=per_worker,
                )  # fmt: skip
                cleanup.callback(_stop, worker)
        with open(data_dir / "dashboard.log", "wb") as out:
            dashboard = subprocess.Popen(
                dashboard_argv(sys.executable, "127.0.0.1", port),
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        cleanup.callback(_stop, dashboard)
        wait_for(lambda: dashboard.poll() is not None or _answers(f"{base}/login/"), 60, "daphne")
        if dashboard.poll() is not None:
            raise SystemExit(f"daphne stopped:\n{(data_dir / 'dashboard.log').read_text()[-2000:]}")
        cookie_name = settings.SESSION_COOKIE_NAME
        cookies = [_login(base, u.username, pw, cookie_name) for u, pw in viewer_logins]
        db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-db")
        cleanup.callback(db.shutdown)
        cleanup.callback(lambda: db.submit(connections.close_all).result())
        stack = Stack(
            base=base,
            operator_token=operator_token,
            reviewer_token=reviewer_token,
            viewer_cookies=cookies,
            cookie_name=cookie_name,
            slug=imported.slug,
            server=server,
            db=db,
        )
        print(f"[{mode}] {layout}; daphne on {base}", flush=True)
        results: dict[str, Any] = {"mode": mode, "layout": layout, "start_load": start_load}
        for label, n in (("alone", 1), ("at once", args.runs)):
            phase_load = load_line()
            outcome = asyncio.run(phase(stack, n, args.viewers, args.timeout))
            outcome["load"] = phase_load
            results[label] = outcome
            if n == 1:
                loop_db = stack.db.submit(
                    _consumer_cost, outcome["run_ids"][0], viewer_logins[0][0].username
                )
                results["consumer"] = loop_db.result()
                print(
                    f"[{mode}] per message and viewer, RunConsumer's work (run alone, after it "
                    f"finished): median {results['consumer']['ms']:.0f} ms, "
                    f"{results['consumer']['queries']:.0f} queries, "
                    f"{results['consumer']['bytes']:.0f} bytes; each further viewer of the same "
                    f"event: {results['consumer']['further_ms']:.0f} ms, "
                    f"{results['consumer']['further_queries']:.0f} queries",
                    flush=True,
                )
            print(
                f"[{mode}] {n} {label}: {outcome['succeeded']}/{n} succeeded "
                f"{outcome['statuses']}, {outcome['lost']} events lost, wall "
                f"{outcome['wall_s']:.1f} s, step-event p50 {outcome['p50_ms']:.0f} / p95 "
                f"{outcome['p95_ms']:.0f} ms, of which the step's transaction after its event row "
                f"p50 {outcome['tx_p50_ms']:.0f} / p95 {outcome['tx_p95_ms']:.0f} ms "
                f"(load before: {phase_load})",
                flush=True,
            )
            if outcome["failures"]:
                print(f"[{mode}]   failures: {outcome['failures']}", flush=True)
            if outcome["viewer_errors"]:
                print(f"[{mode}]   viewer errors: {outcome['viewer_errors']}", flush=True)
        results["end_load"] = load_line()
        healthy[0] = not any(
            results[label]["succeeded"] < results[label]["runs"]
            or results[label]["viewer_error_count"]
            for label in ("alone", "at once")
        )
    leftovers = [p.name for p in sandbox_dir.iterdir()] if sandbox_dir.exists() else []
    results["sandboxes_left"] = leftovers
    print(f"[{mode}] end: {results['end_load']}", flush=True)
    return results


# Output ------------------------------------------------------------------------------------------


def table(results: list[dict[str, Any]], runs: int) -> str:
    lines = [
        f"{runs} concurrent runs of the demo workflow, {results[0]['at once']['viewers_per_run']} "
        f"websocket viewers each ({os.cpu_count()} CPUs)",
        "",
        "| mode | runs | succeeded | viewers | events (step) | lost | gaps / doubles | "
        "step-event latency p50 / p95 (max) | of which in the step's transaction, p50 / p95 | "
        "wall | vs one alone × N | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        alone, many = result["alone"], result["at once"]
        for label, r in (("alone", alone), ("at once", many)):
            ratio = ""
            if label == "at once":
                ratio = f"{r['wall_s']:.1f} s / {alone['wall_s'] * runs:.1f} s = " + (
                    f"**{r['wall_s'] / (alone['wall_s'] * runs):.2f}×**"
                )
            lines.append(
                f"| {result['mode']} | {r['runs']} | {r['succeeded']}/{r['runs']} | "
                f"{r['viewers']} ({r['viewer_error_count']} refused or cut) | "
                f"{r['events']} ({r['step_events']}) | {r['lost']} | "
                f"{r['viewers_with_gaps']} / {r['duplicated']} | "
                f"{r['p50_ms']:.0f} / **{r['p95_ms']:.0f} ms** ({r['max_ms']:.0f}) | "
                f"{r['tx_p50_ms']:.0f} / {r['tx_p95_ms']:.0f} ms | "
                f"{r['wall_s']:.1f} s | {ratio} | {r['load'].split('(1/5/15 min) ')[-1]} |"
            )
    lines.append("")
    for result in results:
        lines.append(
            f"- {result['mode']}: {result['layout']}; start {result['start_load']}; "
            f"end {result['end_load']}"
        )
    return "\n".join(lines)


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--viewers", type=int, default=5)
    parser.add_argument("--mode", choices=("both", *MODES), default="both")
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--workers", type=int, default=2, help="Celery worker processes")
    parser.add_argument(
        "--embedded-threads", type=int, default=0, help="PANDAWEB_RUN_THREADS (default: --runs)"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per phase")
    parser.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    # Ctrl-C and a plain `kill` clean up alike, also when started in the background (where SIGINT
    # comes ignored) and inside asyncio.run (which would only cancel its task on the first one).
    signal.signal(signal.SIGINT, _interrupted)
    signal.signal(signal.SIGTERM, _interrupted)
    if args.mode != "both":
        result = one_mode(args.mode, args)
        if args.result:
            Path(args.result).write_text(json.dumps(result))
        else:
            print("\n" + table([result], args.runs))
        return 0 if result["at once"]["succeeded"] == args.runs else 1
    # Each mode in a process of its own: Django is configured once per process.
    print(f"start: {load_line()}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="pandaweb-bench-hconc-") as scratch:
        for mode in MODES:
            out = Path(scratch) / f"{mode}.json"
            argv = [
                sys.executable, __file__, "--mode", mode, "--result", str(out),
                "--runs", str(args.runs), "--viewers", str(args.viewers),
                "--database-url", args.database_url, "--redis-url", args.redis_url,
                "--workers", str(args.workers), "--embedded-threads", str(args.embedded_threads),
                "--timeout", str(args.timeout),
            ]  # fmt: skip
            child = subprocess.Popen(argv)
            try:
                child.wait()
            except KeyboardInterrupt:
                child.terminate()  # it may have had the Ctrl-C too: cleaning up twice is safe
                child.wait()
                raise
            if not out.exists():
                print(f"{mode}: no result (exit {child.returncode})")
                continue
            results.append(json.loads(out.read_text()))
    if results:
        print("\n" + table(results, args.runs))
    print(f"\nend: {load_line()}")
    ok = len(results) == len(MODES) and all(r["at once"]["succeeded"] == args.runs for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
