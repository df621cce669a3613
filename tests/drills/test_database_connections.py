"""Drills on a real daphne process and its PostgreSQL connections: a burst of API requests stays
within the pool's bound (``PANDAWEB_DB_POOL_MAX``) with no 5xx, and the API and ``/mcp/`` answer
again after the server closed every connection daphne held."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from django.contrib.auth.models import User
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from approvals.models import ApprovalRequest
from approvals.services import evidence_hash
from pandaweb.core.roles import Role
from tests.api.conftest import make_token
from tests.drills.conftest import ROOT, _database_url, until
from tests.e2e.conftest import free_port
from tests.factories import ApprovalRequestFactory, user_with_role
from tests.sessions.conftest import acme_credential, demo_workflow, operator
from workflows.models import Workflow

__all__ = ["acme_credential", "demo_workflow", "operator"]

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

POOL_MAX = 5
CLIENTS = 20
REQUESTS_PER_CLIENT = 100  # 2,000 in all
WRITE_EVERY = 10  # every tenth request of a client decides its approval (refused once decided)
APPLICATION = "pandaweb-drill-daphne"


@dataclass
class Client:
    token: str
    approval: ApprovalRequest


@pytest.fixture
def daphne(tmp_path: Path, short_tmp: Path) -> Iterator[int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    env |= {
        "DATABASE_URL": _database_url(),
        "PANDAWEB_DB_POOL_MAX": str(POOL_MAX),
        "PANDAWEB_API_RATE_LIMIT": "100000",
        # Background work a decision queues runs in this process, on the same pool.
        "PANDAWEB_RUN_EXECUTION": "thread",
        "PANDAWEB_EMBEDDED_WORKER": "0",
        "PANDAWEB_SANDBOX_DIR": str(short_tmp / "sandboxes"),
        "PANDAWEB_RUN_FILES_DIR": str(tmp_path / "runs"),
        # libpq names every connection of the process, so they can be counted apart from ours.
        "PGAPPNAME": APPLICATION,
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "daphne.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
             "pandaweb.asgi:application"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        until(lambda: b"Listening on TCP address" in log.read_bytes(), 60, "daphne to listen")
        yield port
    finally:
        server.terminate()
        server.wait(timeout=30)


def daphne_connections(admin: psycopg.Connection[tuple[int]]) -> int:
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name = %s",
        [APPLICATION],
    ).fetchone()
    return int(row[0]) if row else 0


def test_2000_api_requests_from_20_clients_stay_within_the_pool_without_a_5xx(
    daphne: int,
) -> None:
    clients = []
    for _ in range(CLIENTS):
        evidence = {"step_index": 0, "step_id": "pay", "action": "Click it", "filled": []}
        approval = ApprovalRequestFactory.create(
            evidence=evidence, evidence_sha256=evidence_hash(evidence)
        )
        clients.append(Client(make_token(user_with_role(Role.REVIEWERS)), approval))
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    lock = threading.Lock()
    done = threading.Event()
    samples: list[int] = []

    def sample() -> None:
        with psycopg.connect(_database_url(), autocommit=True) as admin:
            while not done.is_set():
                samples.append(daphne_connections(admin))
                done.wait(0.02)

    def work(client: Client) -> None:
        server = http.client.HTTPConnection("127.0.0.1", daphne, timeout=60)
        headers = {"Authorization": f"Bearer {client.token}", "Content-Type": "application/json"}
        decision = json.dumps(
            {"verdict": "reject", "evidence_sha256": client.approval.evidence_sha256,
             "reason": "drill"}
        )  # fmt: skip
        for i in range(REQUESTS_PER_CLIENT):
            if i % WRITE_EVERY == 0:
                path = f"/api/v1/approvals/{client.approval.pk}/decision"
                server.request("POST", path, body=decision, headers=headers)
            else:
                server.request("GET", "/api/v1/runs/?limit=5", headers=headers)
            response = server.getresponse()
            body = response.read()
            with lock:
                statuses[response.status] += 1
                if response.status >= 500 or (i == 0 and response.status != 200):
                    failures.append(f"{response.status} {body[:300]!r}")

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    threads = [threading.Thread(target=work, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    elapsed = time.monotonic() - started
    done.set()
    sampler.join(timeout=10)

    assert sum(statuses.values()) == CLIENTS * REQUESTS_PER_CLIENT, statuses
    assert failures == [], failures[:5]
    # Every client's first decision is taken; the later ones are refused as already decided.
    assert statuses[200] >= CLIENTS * (REQUESTS_PER_CLIENT - REQUESTS_PER_CLIENT // WRITE_EVERY)
    assert ApprovalRequest.objects.filter(status=ApprovalRequest.Status.REJECTED).count() == CLIENTS
    assert samples, "the sampler never ran"
    assert max(samples) <= POOL_MAX, f"{max(samples)} connections, bound {POOL_MAX}"
    print(f"\n{CLIENTS * REQUESTS_PER_CLIENT} requests in {elapsed:.1f} s: {dict(statuses)}; "
          f"daphne's connections: at most {max(samples)} over {len(samples)} samples")  # fmt: skip


def list_tools_over_mcp(port: int, token: str) -> list[str]:
    async def talk() -> list[str]:
        client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        url = f"http://127.0.0.1:{port}/mcp/"
        async with client, streamable_http_client(url, http_client=client) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(
                read, write, client_info=types.Implementation(name="drill", version="1")
            ) as session:
                await session.initialize()
                return [tool.name for tool in (await session.list_tools()).tools]

    return asyncio.run(talk())


def api_get(port: int, token: str, path: str) -> tuple[int, bytes]:
    server = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        server.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        response = server.getresponse()
        return response.status, response.read()
    finally:
        server.close()


def test_the_api_and_mcp_answer_again_after_postgresql_closed_daphnes_connections(
    daphne: int, operator: User, demo_workflow: Workflow
) -> None:
    token = make_token(operator)
    Workflow.objects.filter(pk=demo_workflow.pk).update(offer_as_tool=True)
    before = list_tools_over_mcp(daphne, token)
    assert demo_workflow.slug in before
    assert api_get(daphne, token, "/api/v1/runs/?limit=5")[0] == 200

    with psycopg.connect(_database_url(), autocommit=True) as admin:
        assert daphne_connections(admin) >= 1, "daphne should hold pooled connections by now"
        # What a database restart, a failover or an idle timeout does to them.
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s",
            [APPLICATION],
        )
        until(lambda: daphne_connections(admin) == 0, 10, "the backends to end")

    assert list_tools_over_mcp(daphne, token) == before
    status, body = api_get(daphne, token, "/api/v1/runs/?limit=5")
    assert status == 200, body[:300]
