"""Chat approvals on the scale-out stack: request opened → Slack card posted, and a signed Slack
click → payment recorded by the portal.

    .venv/bin/python bench/chat_approvals.py [--runs 20]

The stack: PostgreSQL (a scratch database), Redis, one Celery worker process (threads pool, as
``manage.py up`` starts it) and the dashboard under daphne, all on loopback; the demo portal and
a fake of Slack's Web API run in this process (the real Slack cannot be reached from here).

Each run executes the demo workflow in the worker until it waits at Submit payment. Measured:

- *card*: from the request's creation (``ApprovalRequest.created_at``, in the runner's
  transaction) to the fake Slack API receiving ``chat.postMessage`` for it: the commit, the task
  through Redis to a worker, the card built (amount, signed image link) and posted.
- *click*: from sending a signed ``block_actions`` callback (Approve, by a linked Slack user) to
  daphne's ``/integrations/slack/interactions`` to the portal's own timestamp of the payment:
  signature check, replay record, identity, ``approval_decide``, the continuation to the worker
  that holds the browser, re-observation, the click.

Printed: median and p95 of each. Needs PostgreSQL and Redis (``--database-url``, ``--redis-url``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import yaml
from _harness import (
    ROOT,
    demo_workflow,
    free_port,
    load_line,
    portal,
    portal_host,
    scratch_database,
    start_worker,
    wait_for,
)

from pandaweb.supervisor import dashboard_argv
from tests.approvals.fake_slack import FakeSlack, block_action, signed

SECRET = "bench-signing-secret"  # noqa: S105 (the fake Slack app's, on loopback)
CHANNEL = "C0PAYMENTS"
TEAM, SLACK_USER = "T0BENCH", "U0BENCH"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/10")
    args = parser.parse_args()
    print(f"start: {load_line()}")
    database_url, (admin, db_name) = scratch_database(args.database_url)
    data_dir = Path(tempfile.mkdtemp(prefix="pandaweb-bench-chat-"))
    port = free_port()
    fake = FakeSlack().__enter__()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": args.redis_url,
        "PANDAWEB_DATA_DIR": str(data_dir),
        "PANDAWEB_BASE_URL": f"http://127.0.0.1:{port}",
        "PANDAWEB_SLACK_BOT_TOKEN": "xoxb-bench",
        "PANDAWEB_SLACK_SIGNING_SECRET": SECRET,
        "PANDAWEB_SLACK_API_URL": fake.url,
        "DJANGO_SETTINGS_MODULE": "pandaweb.settings",
    }
    os.environ.update(env)
    import django

    django.setup()
    import logging

    from django.contrib.auth.models import Group, User
    from django.core.management import call_command

    from approvals.models import ApprovalRequest
    from pandaweb.core.roles import Role
    from pandaweb.core.services import roles_sync
    from pandaweb.reviewers.models import SlackIdentity
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
    SlackIdentity.objects.create(user=reviewer, team_id=TEAM, slack_user_id=SLACK_USER)
    worker = dashboard = None
    cards: list[float] = []
    clicks: list[float] = []
    answers: list[float] = []
    try:
        with portal() as server:
            workflow = demo_workflow(portal_host(server), steps=None)
            document = yaml.safe_load(workflow.text)
            document["settings"]["approval"] = {"slack_channel": CHANNEL}
            workflows.credential_create(
                user=operator, name="acme-portal", kind="username_password", description="",
                values=dict(workflow.secrets["acme-portal"]),
            )  # fmt: skip
            imported = workflows.workflow_import(user=operator, text=yaml.safe_dump(document))
            workflows.workflow_publish(
                workflow_id=imported.pk, user=operator, message="bench", accept_warnings=True
            )
            worker = start_worker(env, data_dir / "worker.log")
            with open(data_dir / "dashboard.log", "wb") as out:
                dashboard = subprocess.Popen(
                    dashboard_argv(sys.executable, "127.0.0.1", port),
                    cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                )  # fmt: skip
            wait_for(lambda: _answers(f"http://127.0.0.1:{port}/login/"), 60, "the dashboard")
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
                link = f"/approvals/{approval.pk}/"
                post = wait_for(
                    lambda link=link: [
                        c
                        for c in fake.of("chat.postMessage")
                        if c.params["channel"] == CHANNEL and link in json.dumps(c.params)
                    ],
                    30,
                    "the card",
                )[0]
                card = post.wall - approval.created_at.timestamp()
                value = json.dumps({"a": approval.pk, "h": approval.evidence_sha256})
                callback = signed(
                    SECRET,
                    block_action(team=TEAM, user=SLACK_USER, action_id="approve", value=value),
                )
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/integrations/slack/interactions",
                    data=callback["data"].encode(),
                    headers={"Content-Type": callback["content_type"], **callback["headers"]},
                )
                clicked = datetime.now(UTC)
                t0 = time.perf_counter()
                with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 (http)
                    assert response.status == 200
                answered = time.perf_counter() - t0
                payment = wait_for(lambda: server.state.payments(), 60, "the payment")[0]
                wait_for(lambda run=run: Run.objects.get(pk=run.pk).is_final, 60, "the run to end")
                click = (payment.created_at - clicked).total_seconds()
                label = "warm-up" if index == 0 else f"{index:2d}"
                print(
                    f"  run {label}: card {card * 1000:6.0f} ms, click → payment "
                    f"{click * 1000:6.0f} ms (callback answered in {answered * 1000:4.0f} ms)"
                )
                if index:
                    cards.append(card * 1000)
                    clicks.append(click * 1000)
                    answers.append(answered * 1000)
    finally:
        for process in (dashboard, worker):
            if process is not None:
                process.terminate()
                process.wait(timeout=30)
        fake.__exit__()
        from django.db import connections

        connections.close_all()
        admin.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
    print(f"\nchat approvals, {len(cards)} runs ({load_line()})")
    print(f"  {'ms':<40}{'min':>8}{'median':>8}{'p95':>8}{'max':>8}")
    for name, values in (
        ("request opened → card posted", cards),
        ("Slack click → payment recorded", clicks),
        ("Slack click → callback answered", answers),
    ):
        print(
            f"  {name:<40}{min(values):8.0f}{statistics.median(values):8.0f}"
            f"{percentile(values, 0.95):8.0f}{max(values):8.0f}"
        )
    median = statistics.median(clicks)
    print(
        f"  click median {median:.0f} ms: {'meets' if median <= 1000 else 'ABOVE'} the 1 s target"
    )
    print(f"end: {load_line()}")
    return 0


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):  # noqa: S310 (http, loopback)
            return True
    except OSError:
        return False


if __name__ == "__main__":
    raise SystemExit(main())
