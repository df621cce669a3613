"""Teams over /api/v1 and MCP: a token sees and changes its owner's teams' workflows,
credentials, schedules and batches only; another team's are not found."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User

from pandaweb.api.mcp_server import list_tools_for
from pandaweb.api.services import token_authenticate
from pandaweb.core.models import Membership, Team
from pandaweb.core.roles import Role
from pandaweb.schedules.models import Batch, Schedule
from tests.api.conftest import Api, make_token
from tests.factories import member_of, user_with_role
from workflows import services
from workflows.models import Credential, Workflow

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_background_runs")]


@pytest.fixture
def admin() -> User:
    return user_with_role(Role.ADMINS, username="ada")


def document(slug: str) -> str:
    return yaml.safe_dump(
        {
            "pandaweb": 1, "name": slug.title(), "slug": slug,
            "settings": {"allowed_hosts": ["127.0.0.1:8001"]},
            "parameters": [{"name": "invoice", "type": "string"}],
            "steps": [{"id": "open", "type": "goto",
                       "url": "http://127.0.0.1:8001/{{ params.invoice }}"}],
        }
    )  # fmt: skip


@pytest.fixture
def invoices(ours: User) -> Workflow:
    workflow = services.workflow_import(user=ours, text=document("invoices"))
    services.workflow_publish(workflow_id=workflow.pk, user=ours, message="v1")
    Workflow.objects.filter(pk=workflow.pk).update(offer_as_tool=True)
    return workflow


def api(user: User) -> Api:
    return Api(make_token(user))


def post_file(client: Api, text: str, query: str = "") -> Any:
    return client.client.post(
        f"/api/v1/workflows/import{query}",
        text,
        content_type="application/yaml",
        headers={"Authorization": f"Bearer {client.token}"},
    )


def test_workflows_are_listed_and_found_in_the_owners_teams_only(
    invoices: Workflow, ours: User, theirs: User, admin: User
) -> None:
    assert [w["slug"] for w in api(ours).get("/workflows/").json()] == ["invoices"]
    assert api(theirs).get("/workflows/").json() == []
    assert [w["team"] for w in api(admin).get("/workflows/").json()] == ["payables"]
    assert api(ours).get("/workflows/invoices").json()["team"] == "payables"
    for path in ("", "/versions", "/versions/1", "/draft", "/diff?from=1"):
        assert api(theirs).get(f"/workflows/invoices{path}").status_code == 404, path
    assert api(theirs).post("/workflows/invoices/publish", {"message": "x"}).status_code == 404
    assert api(admin).get("/workflows/invoices/versions/1").status_code == 200


def test_an_import_names_the_team_of_a_new_workflow_when_the_owner_has_several(
    procurement: Team, ours: User
) -> None:
    Membership.objects.create(team=procurement, user=ours, role=Role.OPERATORS.value)
    client = api(ours)

    refused = post_file(client, document("orders"))
    made = post_file(client, document("orders"), "?team=procurement")

    assert refused.status_code == 422
    assert refused.json()["errors"] == [
        {"field": "team", "message": "say which team: payables or procurement"}
    ]
    assert made.status_code == 201, made.content
    assert made.json()["team"] == "procurement"
    assert Workflow.objects.get(slug="orders").team_id == procurement.pk


def test_credentials_carry_their_team_and_another_teams_is_not_found(
    ours: User, theirs: User, admin: User
) -> None:
    body = {"name": "ledger", "kind": "api_token", "values": {"token": "s3cret"}}

    made = api(ours).post("/credentials/", body)

    assert made.status_code == 201, made.content
    assert made.json()["team"] == "payables"
    assert api(theirs).get("/credentials/").json() == []
    assert [c["name"] for c in api(admin).get("/credentials/").json()] == ["ledger"]
    replaced = api(theirs).post("/credentials/ledger/value", {"values": {"token": "x"}})
    assert replaced.status_code == 404
    refused = api(ours).post("/credentials/", {**body, "name": "other", "team": "procurement"})
    assert refused.status_code == 422
    assert not Credential.objects.filter(name="other").exists()


def test_schedules_and_batches_of_another_team_are_not_found_nor_made(
    invoices: Workflow, ours: User, theirs: User
) -> None:
    schedule = {"workflow": "invoices", "name": "Daily", "cron": "0 6 * * *",
                "timezone": "UTC", "inputs": {"invoice": "INV-1"}}  # fmt: skip
    made = api(ours).post("/schedules/", schedule)
    assert made.status_code == 201, made.content
    schedule_id = made.json()["id"]
    batch = api(ours).post("/batches/", {"workflow": "invoices", "rows": [{"invoice": "INV-2"}]})
    assert batch.status_code == 201, batch.content

    stranger = api(theirs)
    assert stranger.get("/schedules/").json() == []
    assert stranger.get(f"/schedules/{schedule_id}").status_code == 404
    assert stranger.get(f"/batches/{batch.json()['id']}").status_code == 404
    assert stranger.post("/schedules/", schedule).status_code == 422
    refused = stranger.post("/batches/", {"workflow": "invoices", "rows": [{"invoice": "INV-3"}]})
    assert refused.status_code == 422
    assert Schedule.objects.count() == 1
    assert Batch.objects.count() == 1


def test_a_reviewer_of_the_team_may_not_schedule_its_runs(
    invoices: Workflow, payables: Team, procurement: Team
) -> None:
    reviewer = member_of(payables, Role.REVIEWERS, username="rory")
    Membership.objects.create(team=procurement, user=reviewer, role=Role.OPERATORS.value)
    schedule = {"workflow": "invoices", "name": "Daily", "cron": "0 6 * * *",
                "timezone": "UTC", "inputs": {"invoice": "INV-1"}}  # fmt: skip

    refused = api(reviewer).post("/schedules/", schedule)

    assert refused.status_code == 409
    assert "may not schedule runs of Payables's workflows" in refused.json()["detail"]
    assert not Schedule.objects.exists()


def test_mcp_offers_a_token_its_owners_teams_workflows_only(
    invoices: Workflow, ours: User, theirs: User, admin: User
) -> None:
    def tools(user: User) -> list[str]:
        token = token_authenticate(make_token(user, ["tools:call"]))
        assert token is not None
        return [t.name for t in list_tools_for(token)]

    assert tools(ours) == ["invoices", "run_status", "run_cancel"]
    assert tools(theirs) == ["run_status", "run_cancel"]
    assert tools(admin) == ["invoices", "run_status", "run_cancel"]


def test_a_reviewer_of_the_team_who_authors_elsewhere_reads_but_may_not_change_it(
    invoices: Workflow, payables: Team, theirs: User
) -> None:
    Membership.objects.create(team=payables, user=theirs, role=Role.REVIEWERS.value)
    client = api(theirs)

    assert client.get("/workflows/invoices").status_code == 200
    started = client.post("/workflows/invoices/draft")
    imported = post_file(client, document("invoices").replace("Invoices", "Mine"))

    assert started.status_code == 403
    assert started.json()["detail"] == "you may not change Payables's workflows"
    assert imported.status_code == 403
    assert not invoices.versions.filter(status="draft").exists()
