"""The audit trail's events over the API, as a collector (a SIEM) reads them: in chain order,
a page at a time after the last one it has, narrowed to what the reader may see."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from pandaweb_client import Client as PandawebClient
from pytest_django.live_server_helper import LiveServer

from pandaweb.audit.services import audit_record
from pandaweb.core.models import Team
from pandaweb.core.roles import Role
from tests.api.conftest import Api, make_token
from tests.api.test_api import problem
from tests.factories import member_of

pytestmark = pytest.mark.django_db


def record(action: str, *, team: Team | None = None, object_id: int = 1) -> None:
    with transaction.atomic():
        audit_record(
            action=action,
            object_type="workflow",
            object_id=object_id,
            team_id=team.pk if team else None,
        )


def read(api: Api, **params: Any) -> dict[str, Any]:
    answer = api.get("/audit/events", params)
    assert answer.status_code == 200, answer.content
    return dict(json.loads(answer.content))


def test_a_collector_reads_every_event_once_in_chain_order(
    compliance: User, payables: Team
) -> None:
    api = Api(make_token(compliance, ["audit:read"]))
    start = read(api, limit=200)["next_after"]  # the trail so far: the token's making among it
    for n in range(5):
        record("workflow.edited", team=payables, object_id=n)

    first = read(api, after=start, limit=3)
    rest = read(api, after=first["next_after"], limit=3)
    record("workflow.published", team=payables)
    later = read(api, after=rest["next_after"], limit=3)
    nothing_new = read(api, after=later["next_after"])

    items = first["items"] + rest["items"] + later["items"]
    assert (first["more"], rest["more"], later["more"]) == (True, False, False)
    sequences = [e["sequence"] for e in items]
    assert sequences == sorted(sequences)
    assert len(set(sequences)) == len(sequences)
    assert [e["action"] for e in items][-1] == "workflow.published"
    # Each event carries its link in the chain: a collector can check it as it goes.
    assert all(b["prev_hash"] == a["hash"] for a, b in itertools.pairwise(items))
    assert items[0]["team"] == "payables"
    assert nothing_new == {"items": [], "next_after": later["next_after"], "more": False}


def test_filters_narrow_it_and_a_team_reader_sees_their_teams_trail_only(
    payables: Team, procurement: Team
) -> None:
    record("workflow.edited", team=payables)
    record("run.launched", team=payables)
    record("workflow.edited", team=procurement)
    record("token.created")  # the installation's own: no team
    carla = member_of(payables, Role.COMPLIANCE, username="carla")

    seen = read(Api(make_token(carla, ["audit:read"])))["items"]
    edits = read(Api(make_token(carla, ["audit:read"])), action="workflow.")["items"]

    assert [(e["action"], e["team"]) for e in seen] == [
        ("workflow.edited", "payables"),
        ("run.launched", "payables"),
    ]
    assert [e["action"] for e in edits] == ["workflow.edited"]


def test_it_needs_the_audit_scope_and_a_sensible_cursor(operator: User, compliance: User) -> None:
    refused = problem(Api(make_token(operator)).get("/audit/events"), 403)
    negative = problem(
        Api(make_token(compliance, ["audit:read"])).get("/audit/events?after=-1"), 422
    )

    assert refused["type"].endswith("missing-scope")
    assert negative["errors"][0]["field"] == "after"


@pytest.mark.django_db(transaction=True)
def test_the_client_collects_the_trail_page_by_page(
    live_server: LiveServer, compliance: User, payables: Team
) -> None:
    for n in range(5):
        record("workflow.edited", team=payables, object_id=n)

    with PandawebClient(live_server.url, make_token(compliance, ["audit:read"])) as client:
        edits = list(client.audit_events(action="workflow.", limit=2))
        since = list(client.audit_events(after=edits[2]["sequence"], action="workflow."))

    assert [e["object_id"] for e in edits] == ["0", "1", "2", "3", "4"]
    assert since == edits[3:]
