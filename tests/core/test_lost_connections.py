"""Work done outside Django's request cycle (the MCP server, websocket consumers, a run's writer
and heartbeat threads) gets over database connections the server closed, as requests do.

PostgreSQL only: the test closes every other connection to the test database server-side, as a
database restart, a failover or an idle timeout in front of the server would.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import User
from django.db import connection, connections
from django.utils import timezone
from psycopg_pool import ConnectionPool

from approvals.consumers import NavigationConsumer
from approvals.models import ApprovalRequest
from pandaweb.api.mcp_asgi import endpoint as mcp_endpoint
from pandaweb.api.services import BEARER_NEEDED
from pandaweb.core.database import BUSY
from pandaweb.core.roles import Role
from sessions.models import Run
from sessions.services.writer import Heartbeat, RunSink
from tests.api.conftest import make_token
from tests.api.test_mcp import names, offered
from tests.core.test_database import pool_taken
from tests.factories import ApprovalRequestFactory, user_with_role, waiting_run
from tests.sessions.conftest import acme_credential, demo_workflow, no_background_runs, operator
from workflows.models import Workflow

__all__ = ["acme_credential", "demo_workflow", "no_background_runs", "operator", "pool_taken"]

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_background_runs", "postgres_only"),
]


@pytest.fixture
def postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("closes connections server-side: PostgreSQL only (DATABASE_URL)")


def terminate_other_backends() -> int:
    """What a restarted server does to every connection of this process but one of its own."""
    params = connection.get_connection_params()
    # This thread's own connection is closed too; it gives it back first, as a request would.
    connections.close_all()
    dsn = {k: v for k, v in params.items() if k in {"host", "port", "user", "dbname", "password"}}
    with psycopg.connect(**dsn, autocommit=True) as admin:
        pids = [
            pid
            for pid, _ in admin.execute(
                "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        ]
        # pg_terminate_backend only signals: until a backend has gone, a check of its
        # connection can still pass and the next query fail (the next test's, once).
        until(
            lambda: (
                not admin.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]
                ).fetchone()
            ),
            "the terminated backends to end",
        )
    return len(pids)


def until(predicate: Callable[[], Any], what: str, timeout: float = 10) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def test_mcp_answers_again_after_the_server_closed_its_connections(
    operator: User, demo_workflow: Workflow
) -> None:
    raw = make_token(operator)
    offered(demo_workflow)
    before = names(raw)

    assert terminate_other_backends() >= 1

    assert names(raw) == before
    assert demo_workflow.slug in before


async def call_mcp(token: str) -> tuple[int, dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/mcp",
        "headers": [(b"authorization", f"Bearer {token}".encode())],
    }
    await mcp_endpoint(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body)


def test_a_pool_full_of_connections_the_server_closed_serves_the_next_call(
    operator: User, demo_workflow: Workflow
) -> None:
    raw = make_token(operator)
    offered(demo_workflow)
    pool: ConnectionPool | None = getattr(connection, "pool", None)
    if pool is None:
        pytest.skip("the connection pool is configured with PANDAWEB_DB_POOL_MAX > 0")
    connections.close_all()
    idle = [pool.getconn() for _ in range(6)]
    for conn in idle:
        pool.putconn(conn)

    terminate_other_backends()

    # psycopg_pool's own check would try the six in turn, 1 s, 2 s, 4 s… apart, past the
    # pool's timeout.
    assert demo_workflow.slug in names(raw)


def test_the_mcp_endpoint_checks_tokens_again_after_the_server_closed_its_connections() -> None:
    assert asyncio.run(call_mcp("pw_unknown"))[0] == 401

    terminate_other_backends()

    status, body = asyncio.run(call_mcp("pw_unknown"))
    assert (status, body["error"]) == (401, BEARER_NEEDED)


def test_the_mcp_endpoint_without_a_free_connection_says_to_retry(pool_taken: None) -> None:
    status, body = asyncio.run(call_mcp("pw_unknown"))

    assert (status, body["error"]) == (503, BUSY)


def test_a_websocket_consumer_reads_again_after_the_server_closed_its_connections() -> None:
    # The consumer's own read, not through channels' test communicator: that one turns off the
    # connection clean-up around database calls that daphne relies on.
    consumer = NavigationConsumer()
    consumer.scope = {"user": user_with_role(Role.REVIEWERS)}
    ApprovalRequestFactory.create()
    before = asyncio.run(consumer._badge())

    terminate_other_backends()

    assert asyncio.run(consumer._badge()) == before
    assert before is not None
    assert 'title="1 pending approval' in before


class Quiet:
    def request_stop(self, reason: str) -> None:
        raise AssertionError(f"nothing asked this run to stop: {reason}")


def test_a_runs_heartbeat_goes_on_after_the_server_closed_its_connection() -> None:
    run = waiting_run()
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    heartbeat = Heartbeat(run.pk, Quiet(), interval=0.05, beat_every=1)  # type: ignore[arg-type]
    heartbeat.start()
    try:
        until(lambda: Run.objects.get(pk=run.pk).heartbeat_at, "a first beat")

        terminate_other_backends()
        after = timezone.now()

        until(
            lambda: (Run.objects.get(pk=run.pk).heartbeat_at or after) > after, "a beat after that"
        )
    finally:
        heartbeat.stop()


def test_a_runs_writer_records_an_intent_after_the_server_closed_its_connection() -> None:
    first = ApprovalRequestFactory.create(status=ApprovalRequest.Status.APPROVED, step_index=0)
    second = ApprovalRequestFactory.create(
        run=first.run, status=ApprovalRequest.Status.APPROVED, step_index=1
    )
    Run.objects.filter(pk=first.run_id).update(status=Run.Status.RUNNING)
    sink = RunSink(first.run_id)
    try:
        sink.approval_id = first.pk
        sink.action_starting(0)  # the writer's thread now has a connection

        terminate_other_backends()
        sink.approval_id = second.pk
        sink.action_starting(1)
    finally:
        sink.close()

    second.refresh_from_db()
    assert second.intent_at is not None
