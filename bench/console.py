"""Server time of the operations console's pages with many runs.

    DATABASE_URL=postgresql://... .venv/bin/python bench/console.py [--runs 10000] [--rounds 40]

Seeds the database with ``manage.py seed_runs`` when it holds fewer runs than asked (10,000 runs
and 100,000 steps by default), then requests each page ``--rounds`` times in-process (Django's
test client: URL routing, middleware, queries and template rendering, no network) as a person
holding every role, and prints p50 and p95 server time and the query count per page, with the
machine and its load. The target is p95 <= 150 ms.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pandaweb.settings")

import django  # noqa: E402

from pandaweb.localfiles import ensure_local_files  # noqa: E402

ensure_local_files()
django.setup()

from django.contrib.auth.models import Group, User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402

from pandaweb.core.services import roles_sync  # noqa: E402
from sessions import console  # noqa: E402
from sessions.models import Run, StepResult  # noqa: E402

TARGET_MS = 150.0


def pages(person: User) -> list[tuple[str, str]]:
    flt = console.RunFilter.from_params({})
    second = console.run_page(flt, user=person).next_cursor
    some = Run.objects.order_by("-pk").values_list("inputs", flat=True).first() or {}
    invoice = str(some.get("invoice", "INV-2026"))
    deep = console.run_page(
        console.RunFilter.from_params({"sort": "status"}), user=person, size=5000
    )
    return [
        ("runs list", "/runs/"),
        ("runs, page 2", f"/runs/?after={second}"),
        ("runs, status sort, deep page", f"/runs/?sort=status&after={deep.next_cursor}"),
        ("runs, failed", "/runs/?status=failed"),
        ("runs, search an invoice", f"/runs/?q={invoice}"),
        ("runs, failing step + dates", "/runs/?step=pay&since=2026-01-01&until=2030-01-01"),
        ("home", "/"),
        ("failure triage", "/runs/failures/"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    have = Run.objects.count()
    if have < args.runs:
        with open(os.devnull, "w") as quiet:
            call_command("seed_runs", runs=args.runs - have, steps=args.steps, stdout=quiet)
    roles_sync()
    person, _ = User.objects.get_or_create(username="bench-console")
    person.groups.set(Group.objects.all())
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(person)

    load = os.getloadavg()
    print(f"machine: {platform.node()} · {platform.processor() or platform.machine()} · "
          f"{os.cpu_count()} cores · load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")  # fmt: skip
    print(f"database: {connection.vendor} · {Run.objects.count()} runs · "
          f"{StepResult.objects.count()} steps · {args.rounds} rounds per page")  # fmt: skip
    print(f"{'page':34} {'p50 ms':>8} {'p95 ms':>8} {'queries':>8}")
    worst = 0.0
    captured: list[str] = []

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        captured.append(sql)
        return execute(sql, params, many, context)

    for name, path in pages(person):
        client.get(path)  # warm caches (templates, the database's buffers)
        times = []
        captured.clear()
        with connection.execute_wrapper(count):
            client.get(path)
        for _ in range(args.rounds):
            start = time.perf_counter()
            response = client.get(path)
            times.append((time.perf_counter() - start) * 1000)
            assert response.status_code == 200, (path, response.status_code)
        times.sort()
        p95 = times[max(0, int(len(times) * 0.95) - 1)]
        worst = max(worst, p95)
        print(f"{name:34} {statistics.median(times):8.1f} {p95:8.1f} {len(captured):8d}")
    verdict = "within" if worst <= TARGET_MS else "OVER"
    print(f"worst p95 {worst:.1f} ms: {verdict} the {TARGET_MS:.0f} ms target")


if __name__ == "__main__":
    main()
