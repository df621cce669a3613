"""The system page over the API: the same facts, the same capability."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.test import Client

from pandaweb.api.services import TokenError
from pandaweb.core import services as core_services
from pandaweb.core.models import WorkerHeartbeat
from pandaweb.core.roles import Role
from sessions.services import run_launch
from tests.api.conftest import Api, make_token
from tests.api.test_api import problem
from tests.factories import user_with_role
from workflows.models import Workflow

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(db: None) -> User:
    return user_with_role(Role.ADMINS, username="ada")


@pytest.fixture
def pings(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """The pings queued for the workers (none is sent here)."""
    sent: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(
        core_services,
        "dispatch",
        lambda task, queue=None, **kwargs: sent.append((task.name, kwargs)),
    )
    return sent


def test_it_answers_what_the_system_page_shows(
    admin: User, operator: User, demo_workflow: Workflow
) -> None:
    run = run_launch(
        workflow_id=demo_workflow.pk,
        user=operator,
        raw_inputs={"invoice": "INV-1001", "amount": "1250.00"},
    )
    core_services.heartbeat_record(
        mode=WorkerHeartbeat.Mode.CELERY, worker="celery@host-1", nonce="abc"
    )

    health = Api(make_token(admin, ["system:read"])).get("/system/health").json()

    assert health["database"] == connection.vendor
    assert health["channel_layer"].endswith("ChannelLayer")
    assert health["execution"] in {"thread", "celery"}
    assert [(w["worker"], w["mode"], w["ping_nonce"]) for w in health["workers"]] == [
        ("celery@host-1", "celery", "abc")
    ]
    assert health["workers"][0]["seconds_since_seen"] < 60
    assert (health["queued"], health["active"]) == (1, 0)
    assert health["oldest_queued"]["run"] == run.pk
    assert health["oldest_queued"]["workflow"] == demo_workflow.slug
    assert health["approvals_expiring"] == []


def test_it_needs_its_scope_and_the_system_capability(admin: User, operator: User) -> None:
    without = Api(make_token(admin, ["webhooks:read"]))
    with_scope = Api(make_token(admin, ["system:read"]))

    assert problem(without.get("/system/health"), 403)["type"].endswith("/missing-scope")
    with pytest.raises(TokenError):
        make_token(operator, ["system:read"])
    admin.groups.remove(Group.objects.get(name=Role.ADMINS.value))
    refused = problem(with_scope.get("/system/health"), 403)
    assert refused["type"].endswith("/scope-beyond-role")


def test_the_ping_is_queued_for_the_workers_as_the_pages_button_queues_it(
    admin: User, pings: list[tuple[str, dict[str, Any]]]
) -> None:
    answer = Api(make_token(admin, ["system:read"])).post("/system/workers/ping")
    page = Client()
    page.force_login(admin)
    page.post("/system/ping/")

    assert answer.status_code == 202, answer.content
    assert [name for name, _ in pings] == ["core.worker_ping", "core.worker_ping"]
    assert pings[0][1] == {"nonce": answer.json()["nonce"]}
    assert pings[0][1] != pings[1][1]


def test_the_system_endpoints_are_in_the_openapi_document_with_a_summary_and_their_scope(
    client: Client,
) -> None:
    paths = json.loads(client.get("/api/v1/openapi.json").content)["paths"]

    for path, method in [("/api/v1/system/health", "get"), ("/api/v1/system/workers/ping", "post")]:
        operation = paths[path][method]
        assert operation["summary"][0].isupper()
        assert "Scope: ``system:read``" in operation["description"]
