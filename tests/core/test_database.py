"""No free database connection: the request is told to come back (503), never a 500."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from django.db import connection, connections
from django.test import Client
from psycopg_pool import ConnectionPool, PoolTimeout

from pandaweb.core.roles import Role
from tests.api.conftest import make_token
from tests.factories import user_with_role

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def raw_token(db: None) -> str:
    return make_token(user_with_role(Role.OPERATORS, username="olga"))


@pytest.fixture
def pool_taken() -> Iterator[None]:
    """Every connection of this process's pool busy elsewhere, as under a burst of requests."""
    pool: ConnectionPool | None = getattr(connection, "pool", None)
    if pool is None:
        pytest.skip("the connection pool is PostgreSQL's (DATABASE_URL)")
    connections.close_all()
    timeout = pool.timeout
    held = []
    try:
        # Every connection the pool can still give, whatever an earlier test's thread kept.
        while True:
            try:
                held.append(pool.getconn(timeout=0.5))
            except PoolTimeout:
                break
        pool.timeout = 0.5
        yield
    finally:
        pool.timeout = timeout
        for conn in held:
            pool.putconn(conn)
        # The next test starts with a pool as small as a fresh process has.
        connections.close_all()
        connection.close_pool()  # type: ignore[attr-defined]


def test_an_api_request_without_a_free_connection_is_a_problem_to_retry(
    raw_token: str, pool_taken: None
) -> None:
    response = Client().get("/api/v1/runs/", headers={"Authorization": f"Bearer {raw_token}"})

    assert response.status_code == 503
    assert response["Content-Type"] == "application/problem+json"
    assert response["Retry-After"] == "5"
    assert json.loads(response.content)["type"].endswith("/unavailable")


def test_a_page_without_a_free_connection_says_the_dashboard_is_busy(pool_taken: None) -> None:
    response = Client().get("/login/")

    assert response.status_code == 503
    assert response.content.decode().startswith("The dashboard is busy")
