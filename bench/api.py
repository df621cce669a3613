"""API benchmark: launches per second accepted by POST /api/v1/runs/ (queueing only: execution is
switched off, runs stay queued), GET /api/v1/runs/{id} / the run list with 10,000 runs and
100,000 steps in PostgreSQL, and the event stream's latency from a step's commit to 1 and to 50
clients connected to daphne (``api_events.py``).

Server time is the Django handler's own time for one request (every middleware, token check, rate
limit, queries, JSON), measured in-process with Django's test client, so loopback networking and
the ASGI server are not in it. Also checks that GET run and the list issue the same number of
queries on a small and on the full data set. The event stream's part runs on the scale-out
stack's channel layer (Redis, ``--redis-url``).

    .venv/bin/python bench/api.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import api_events
from _harness import ROOT, load_line


def scratch_database(server_url: str) -> tuple[str, Any, str]:
    import psycopg

    name = f"pandaweb_bench_api_{os.getpid()}"
    admin = psycopg.connect(server_url, autocommit=True)
    admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    admin.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(server_url)
    return urlunsplit(parts._replace(path=f"/{name}")), admin, name


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def line(label: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"{label:<34} n={len(ms):<5} median {statistics.median(ms):6.1f}  p95 {pct(ms, 95):6.1f}  "
        f"p99 {pct(ms, 99):6.1f}  max {max(ms):6.1f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/9")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--steps-per-run", type=int, default=10)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--launch-seconds", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--stream-clients", type=int, default=50)
    parser.add_argument("--stream-events", type=int, default=20, help="step events a round")
    parser.add_argument("--stream-rounds", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    parser.add_argument(
        "--only",
        choices=["events"],
        help="seed as usual, then measure only this part (the event stream's rounds)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="print where GET run spends its time (cProfile)"
    )
    args = parser.parse_args()
    print(f"start: {load_line()}")
    database_url, admin, db_name = scratch_database(args.database_url)
    data_dir = Path(tempfile.mkdtemp(prefix="pandaweb-bench-api-"))
    os.environ.update(
        {
            "DATABASE_URL": database_url,
            "PANDAWEB_DATA_DIR": str(data_dir),
            "PANDAWEB_ALLOWED_HOSTS": "testserver",
            "PANDAWEB_RUN_EXECUTION": "thread",
            "PANDAWEB_API_RATE_LIMIT": "100000000",
            "DJANGO_SETTINGS_MODULE": "pandaweb.settings",
        }
    )
    os.chdir(ROOT)
    import django

    from pandaweb.localfiles import ensure_local_files

    ensure_local_files()
    django.setup()
    try:
        return _bench(args, data_dir)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            admin.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')


def _bench(args: argparse.Namespace, data_dir: Path) -> int:
    import logging

    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from pandaweb.core.roles import Role
    from pandaweb.core.services import roles_sync
    from sessions import services as run_services
    from sessions.models import Run, RunEvent, StepResult
    from tests.factories import user_with_role
    from workflows import services as workflow_services

    logging.disable(logging.WARNING)
    call_command("migrate", verbosity=0)
    roles_sync()
    # Queueing only: the launch's on-commit dispatch does nothing, so runs stay queued.
    run_services.runstate.dispatch = lambda task, **kwargs: None

    operator = user_with_role(Role.OPERATORS, username="bench.operator")
    workflow_services.credential_create(
        user=operator, name="acme-portal", kind="username_password", description="",
        values={"username": "u", "password": "p"},
    )  # fmt: skip
    example = (ROOT / "workflows" / "examples" / "acme-pay-invoice.yaml").read_text()
    workflow = workflow_services.workflow_import(user=operator, text=example)
    version = workflow_services.workflow_publish(
        workflow_id=workflow.pk, user=operator, message="bench", accept_warnings=True
    )
    # Seed -----------------------------------------------------------------------------------
    started = time.perf_counter()
    now = timezone.now()
    statuses = ["succeeded"] * 7 + ["failed", "cancelled", "queued"]
    batch = 2000
    made = 0
    while made < args.runs:
        count = min(batch, args.runs - made)
        runs = Run.objects.bulk_create(
            Run(
                workflow=workflow,
                version=version,
                launched_by=operator,
                status=statuses[(made + i) % len(statuses)],
                inputs={
                    "invoice": f"INV-{(made + i) % 10000:04}",
                    "amount": "12.50",
                    "iban": "DE97 2004 0060 0123 4567 89",
                },
                outputs={"reference": f"PAY-{made + i}"},
                last_event_seq=args.steps_per_run,
            )
            for i in range(count)
        )
        StepResult.objects.bulk_create(
            StepResult(
                run=run,
                index=s,
                step_id=f"step-{s}",
                step_type="click",
                sentence=f"Click the button 'Step {s}'",
                status="succeeded",
                started_at=now,
                duration_ms=120,
                url="http://127.0.0.1:8001/",
                title="Acme",
                observation={"elements": [{"ref": f"e{k}", "role": "button"} for k in range(40)]},
                observation_chars=2400,
                screenshot=f"steps/{s:03}.jpg",
            )
            for run in runs
            for s in range(args.steps_per_run)
        )
        # Each step's event in the runs' logs, which the event stream reads.
        RunEvent.objects.bulk_create(
            RunEvent(run=run, seq=s + 1, type="step", payload={"index": s, "status": "succeeded"})
            for run in runs
            for s in range(args.steps_per_run)
        )
        made += count
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    total_steps = StepResult.objects.count()
    print(
        f"seeded {Run.objects.count():,} runs and {total_steps:,} steps "
        f"in {time.perf_counter() - started:.1f} s"
    )
    ids = list(Run.objects.values_list("pk", flat=True))
    if args.only != "events":
        _http(args, operator=operator, workflow=workflow, version=version, ids=ids)

    # The event stream ----------------------------------------------------------------------------
    api_events.measure(
        data_dir=data_dir, redis_url=args.redis_url, operator=operator, run_ids=ids,
        clients=args.stream_clients,
        events=args.stream_events, rounds=args.stream_rounds,
    )  # fmt: skip
    print(f"end: {load_line()}")
    return 0


def _http(
    args: argparse.Namespace, *, operator: Any, workflow: Any, version: Any, ids: list[int]
) -> None:
    """GET run, the run list and launches, on the seeded database."""
    from django.db import connection, connections
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from pandaweb.api.services import token_create
    from sessions.models import Run

    _, token = token_create(
        actor=operator, owner=operator, name="bench",
        scopes=["runs:read", "runs:launch"], expires_at=None,
    )  # fmt: skip
    headers = {"Authorization": f"Bearer {token}"}
    client = Client()

    def get_run(run_id: int) -> float:
        started = time.perf_counter()
        response = client.get(f"/api/v1/runs/{run_id}", headers=headers)
        elapsed = time.perf_counter() - started
        assert response.status_code == 200, response.content
        return elapsed

    def queries(path: str, params: dict[str, Any] | None = None) -> int:
        client.get(path, params or {}, headers=headers)  # warm (last-used write)
        with CaptureQueriesContext(connection) as captured:
            client.get(path, params or {}, headers=headers)
        return len(captured)

    # Query counts do not depend on the data size ------------------------------------------------
    small = Run.objects.create(workflow=workflow, version=version, launched_by=operator)
    counts = {
        "GET run (0 steps)": queries(f"/api/v1/runs/{small.pk}"),
        f"GET run ({args.steps_per_run} steps)": queries(f"/api/v1/runs/{ids[0]}"),
        "GET list (first page of 50)": queries("/api/v1/runs/"),
        "GET list (input filter)": queries("/api/v1/runs/", {"input": "invoice=INV-0042"}),
    }
    print("queries per request: " + ", ".join(f"{k}: {v}" for k, v in counts.items()))

    # GET run ------------------------------------------------------------------------------------
    for run_id in random.sample(ids, 50):
        get_run(run_id)  # warm caches and connections
    timings = [get_run(run_id) for run_id in random.sample(ids, min(args.samples, len(ids)))]
    print(f"during: {load_line()}")
    print(line("GET /runs/{id} (server time)", timings))
    if args.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        for run_id in random.sample(ids, min(200, len(ids))):
            get_run(run_id)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)

    def get_list(params: dict[str, str]) -> float:
        started = time.perf_counter()
        response = client.get("/api/v1/runs/", params, headers=headers)
        elapsed = time.perf_counter() - started
        assert response.status_code == 200, response.content
        return elapsed

    page_cursor: str | None = None
    pages: list[float] = []
    for _ in range(100):
        params: dict[str, str] = {"limit": "50", **({"cursor": page_cursor} if page_cursor else {})}
        started = time.perf_counter()
        body = json.loads(client.get("/api/v1/runs/", params, headers=headers).content)
        pages.append(time.perf_counter() - started)
        page_cursor = body["next_cursor"]
    print(line("GET /runs/ 50 a page, 100 pages", pages))
    print(line("GET /runs/?status=failed", [get_list({"status": "failed"}) for _ in range(100)]))
    print(
        line(
            "GET /runs/?input=invoice=…",
            [get_list({"input": f"invoice=INV-{n * 97 % 10000:04}"}) for n in range(100)],
        )
    )

    # Launches -----------------------------------------------------------------------------------
    def launch(api_client: Client, n: int, key_prefix: str) -> float:
        body = {
            "workflow": workflow.slug,
            "inputs": {"invoice": f"INV-{n % 10000:04}", "amount": "12.50"},
        }
        started = time.perf_counter()
        response = api_client.post(
            "/api/v1/runs/", json.dumps(body), content_type="application/json",
            headers={**headers, "Idempotency-Key": f"{key_prefix}-{n}"},
        )  # fmt: skip
        elapsed = time.perf_counter() - started
        assert response.status_code == 201, response.content
        return elapsed

    launches: list[float] = []
    deadline = time.perf_counter() + args.launch_seconds
    started = time.perf_counter()
    while time.perf_counter() < deadline:
        launches.append(launch(client, len(launches), "seq"))
    rate = len(launches) / (time.perf_counter() - started)
    print(line("POST /runs/ (one client)", launches))
    print(f"launches accepted: {rate:.0f}/s with one client")

    done: list[float] = []
    lock = threading.Lock()

    def worker(index: int, stop: float) -> None:
        own = Client()
        n = 0
        try:
            while time.perf_counter() < stop:
                elapsed = launch(own, n, f"t{index}")
                n += 1
                with lock:
                    done.append(elapsed)
        finally:
            connections.close_all()

    stop = time.perf_counter() + args.launch_seconds
    started = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i, stop)) for i in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rate = len(done) / (time.perf_counter() - started)
    print(line(f"POST /runs/ ({args.threads} threads)", done))
    print(f"launches accepted: {rate:.0f}/s with {args.threads} threads (one process)")
    assert Run.objects.filter(status="queued", idempotency_key__startswith="seq-").count() == len(
        launches
    )


if __name__ == "__main__":
    raise SystemExit(main())
