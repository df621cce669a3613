"""Approval click → action performed, in scale-out mode (PostgreSQL, Redis, a Celery worker).

    .venv/bin/python bench/approval_latency.py [--runs 20] [--other-worker]

Each run executes the whole demo workflow against a demo portal on loopback in a real Celery
worker process (threads pool, as ``manage.py up`` starts it) until it waits at its irreversible
Submit payment. Then the benchmark decides the approval through the service every entry point
uses (``approval_decide``) and measures until the portal has recorded the payment: the decision's
transaction, the continuation routed to the host's queue through Redis, the runner reconnecting
to the waiting browser, re-observing and comparing the evidence, the intent written to
PostgreSQL, and the click. With ``--other-worker`` two worker processes split the queues (one
takes the shared queue, the other the host's), so every continuation runs in a different process
than the one that started the run; the benchmark checks that it did. The payment's own timestamp
(taken by the portal when it records it) ends the measurement. Printed: median and p95 over
--runs, and where the time goes.

Needs PostgreSQL and Redis: ``--database-url`` names a server database used only to create and
drop a scratch database ``pandaweb_bench_<pid>``; ``--redis-url`` a Redis database to use.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from _harness import (
    demo_workflow,
    load_line,
    portal,
    portal_host,
    scratch_database,
    start_worker,
    wait_for,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument(
        "--other-worker",
        action="store_true",
        help="continue every run in a different worker process than the one that started it",
    )
    args = parser.parse_args()
    print(f"start: {load_line()}")
    database_url, (admin, db_name) = scratch_database(args.database_url)
    data_dir = Path(tempfile.mkdtemp(prefix="pandaweb-bench-approval-"))
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": args.redis_url,
        "PANDAWEB_DATA_DIR": str(data_dir),
        "DJANGO_SETTINGS_MODULE": "pandaweb.settings",
    }
    os.environ.update(env)
    import django

    from pandaweb.localfiles import ensure_local_files

    ensure_local_files()
    django.setup()
    import logging

    from django.contrib.auth.models import Group, User
    from django.core.management import call_command

    from approvals.models import ApprovalRequest
    from approvals.services import approval_decide
    from pandaweb.core.roles import Role
    from pandaweb.core.services import roles_sync
    from sessions import services as runs
    from sessions.models import Run
    from workflows import services as workflows

    logging.getLogger("pandaweb.demo_portal.server").setLevel(logging.WARNING)
    call_command("migrate", verbosity=0)
    roles_sync()
    operator = User.objects.create_user("bench-operator")
    operator.groups.add(Group.objects.get(name=Role.OPERATORS.value))
    reviewer = User.objects.create_user("bench-reviewer")
    reviewer.groups.add(Group.objects.get(name=Role.REVIEWERS.value))
    started: list[subprocess.Popen[bytes]] = []
    samples: list[dict[str, float]] = []
    try:
        with portal() as server:
            workflow = demo_workflow(portal_host(server), steps=None)
            workflows.credential_create(
                user=operator, name="acme-portal", kind="username_password", description="",
                values=dict(workflow.secrets["acme-portal"]),
            )  # fmt: skip
            imported = workflows.workflow_import(user=operator, text=workflow.text)
            workflows.workflow_publish(
                workflow_id=imported.pk, user=operator, message="bench", accept_warnings=True
            )
            if args.other_worker:
                from sessions.services import host_queue

                started.append(
                    start_worker(env, data_dir / "exec.log", queues="pandaweb", name="exec")
                )
                cont_queue = host_queue(socket.gethostname())
                started.append(
                    start_worker(env, data_dir / "cont.log", queues=cont_queue, name="cont")
                )
            else:
                started.append(start_worker(env, data_dir / "worker.log"))
            for index in range(args.runs + 1):
                server.state.reset()
                invoice = next(i for i in server.state.invoices() if i.status == "open")
                run = runs.run_launch(
                    workflow_id=imported.pk,
                    user=operator,
                    raw_inputs={"invoice": invoice.number, "amount": f"{invoice.amount_due:.2f}"},
                )
                wait_for(
                    lambda run=run: Run.objects.filter(
                        pk=run.pk, status=Run.Status.AWAITING_APPROVAL
                    ).exists(),
                    180,
                    f"run {run.pk} to reach its gate",
                )
                approval = ApprovalRequest.objects.get(run=run)
                executed_by = Run.objects.get(pk=run.pk).worker
                clicked = datetime.now(UTC)
                t0 = time.perf_counter()
                approval_decide(
                    approval_id=approval.pk,
                    user=reviewer,
                    approve=True,
                    evidence_sha256=approval.evidence_sha256,
                )
                decided = time.perf_counter() - t0
                payment = wait_for(lambda: server.state.payments(), 60, "the payment")[0]
                wait_for(lambda run=run: Run.objects.get(pk=run.pk).is_final, 60, "the run to end")
                approval.refresh_from_db()
                continued, intent = approval.continued_at, approval.intent_at
                assert continued is not None
                assert intent is not None
                assert approval.decided_at is not None
                sample = {
                    "total": (payment.created_at - clicked).total_seconds(),
                    "decide": decided,
                    "queue": (continued - approval.decided_at).total_seconds(),
                    "reconnect+verify": (intent - continued).total_seconds(),
                    "click": (payment.created_at - intent).total_seconds(),
                }
                status = Run.objects.get(pk=run.pk).status
                continued_by = Run.objects.get(pk=run.pk).worker
                if args.other_worker and continued_by == executed_by:
                    raise SystemExit(f"run {run.pk} continued in the process that started it")
                label = "warm-up" if index == 0 else f"{index:2d}"
                print(
                    f"  run {label}: approval → payment {sample['total'] * 1000:6.0f} ms "
                    f"(run {status})"
                )
                if index:
                    samples.append(sample)
    finally:
        for worker in started:
            worker.terminate()
        for worker in started:
            worker.wait(timeout=30)
        from django.db import connections

        connections.close_all()
        admin.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
    where = "a different worker process" if args.other_worker else "the same worker process"
    print(f"\napproval → action performed, {len(samples)} runs, continued in {where}")
    print(f"  ({load_line()})")
    print(f"  {'ms':<34}{'min':>8}{'median':>8}{'p95':>8}{'max':>8}")
    for key in ("total", "decide", "queue", "reconnect+verify", "click"):
        values = sorted(s[key] * 1000 for s in samples)
        p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
        print(
            f"  {key:<34}{values[0]:8.0f}{statistics.median(values):8.0f}{p95:8.0f}"
            f"{values[-1]:8.0f}"
        )
    median = statistics.median(s["total"] for s in samples) * 1000
    verdict = "meets" if median <= 500 else "ABOVE"
    print(f"  median {median:.0f} ms: {verdict} the 500 ms target")
    print(f"end: {load_line()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
