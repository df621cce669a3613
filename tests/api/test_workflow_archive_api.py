"""Archiving and restoring a workflow through /api/v1/: the workflow page's service and rule
(authoring rights in the workflow's team), what an archived workflow refuses, the audit trail."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from pandaweb.audit.models import AuditEvent
from pandaweb.core.models import Membership, Team
from pandaweb.core.roles import Role
from tests.api.conftest import Api, make_token
from tests.api.test_api import GOOD, problem
from tests.api.test_workflow_api import a_reviewers_token
from tests.factories import member_of
from workflows import services
from workflows.models import Workflow

pytestmark = pytest.mark.django_db

SLUG = "acme-pay-invoice"


def launch(api: Api) -> Any:
    return api.post("/runs/", {"workflow": SLUG, "inputs": GOOD})


def test_an_author_archives_a_workflow_and_nothing_launches_it_until_restored(
    operator: User, demo_workflow: Workflow
) -> None:
    api = Api(make_token(operator))

    archived = api.post(f"/workflows/{SLUG}/archive")

    assert archived.status_code == 200, archived.content
    assert archived.json()["archived"] is True
    assert archived.json() == api.get(f"/workflows/{SLUG}").json()
    demo_workflow.refresh_from_db()
    assert demo_workflow.archived
    [event] = AuditEvent.objects.filter(action="workflow.archived")
    assert (event.actor, event.object_id) == (operator, str(demo_workflow.pk))
    assert (event.before, event.after) == ({"archived": False}, {"archived": True})
    assert event.extra["via"]["channel"] == "api"
    assert [w["slug"] for w in api.get("/workflows/").json()] == []
    assert [w["slug"] for w in api.get("/workflows/", {"archived": "true"}).json()] == [SLUG]
    assert problem(launch(api), 409)["detail"] == "this workflow is archived"
    refused = problem(api.post(f"/workflows/{SLUG}/draft"), 409)
    assert refused["detail"] == "this workflow is archived; restore it before changing it"

    restored = api.post(f"/workflows/{SLUG}/restore")

    assert restored.status_code == 200, restored.content
    assert restored.json()["archived"] is False
    demo_workflow.refresh_from_db()
    assert not demo_workflow.archived
    [event] = AuditEvent.objects.filter(action="workflow.restored")
    assert (event.before, event.after) == ({"archived": True}, {"archived": False})
    assert launch(api).status_code == 201


def test_archiving_twice_changes_nothing_the_second_time(
    operator: User, demo_workflow: Workflow
) -> None:
    api = Api(make_token(operator))

    first = api.post(f"/workflows/{SLUG}/archive")
    second = api.post(f"/workflows/{SLUG}/archive")
    not_archived = api.post(f"/workflows/{SLUG}/restore").json()
    again = api.post(f"/workflows/{SLUG}/restore")

    assert (first.status_code, second.status_code, again.status_code) == (200, 200, 200)
    assert second.json() == first.json()
    assert again.json() == not_archived
    assert AuditEvent.objects.filter(action="workflow.archived").count() == 1
    assert AuditEvent.objects.filter(action="workflow.restored").count() == 1


def test_archiving_needs_the_write_scope_and_a_role_that_writes_workflows(
    operator: User, reviewer: User, demo_workflow: Workflow
) -> None:
    reader = Api(make_token(operator, ["workflows:read", "runs:launch"]))
    former_author = a_reviewers_token(reviewer, ["workflows:read", "workflows:write"])

    missing = problem(reader.post(f"/workflows/{SLUG}/archive"), 403)
    beyond = problem(former_author.post(f"/workflows/{SLUG}/archive"), 403)

    assert missing["type"].endswith("/missing-scope")
    assert missing["detail"] == "this token lacks the scope 'workflows:write'"
    assert beyond["type"].endswith("/scope-beyond-role")
    demo_workflow.refresh_from_db()
    assert not demo_workflow.archived
    assert not AuditEvent.objects.filter(action="workflow.archived").exists()


def test_someone_who_sees_the_workflow_but_writes_another_teams_is_refused(
    demo_workflow: Workflow, procurement: Team
) -> None:
    # Reviews in the workflow's team, writes workflows in another one only.
    person = member_of(procurement, Role.OPERATORS, username="pete")
    Membership.objects.create(team=demo_workflow.team, user=person, role=Role.REVIEWERS.value)
    api = Api(make_token(person, ["workflows:read", "workflows:write"]))

    refused = problem(api.post(f"/workflows/{SLUG}/archive"), 403)

    assert refused["type"].endswith("/workflow-refused")
    assert refused["detail"] == f"you may not change {demo_workflow.team}'s workflows"
    demo_workflow.refresh_from_db()
    assert not demo_workflow.archived


def test_another_teams_workflow_answers_as_a_missing_one(
    demo_workflow: Workflow, procurement: Team
) -> None:
    api = Api(make_token(member_of(procurement, Role.OPERATORS, username="pete")))

    for action in ("archive", "restore"):
        theirs = problem(api.post(f"/workflows/{SLUG}/{action}"), 404)
        missing = problem(api.post(f"/workflows/no-such-workflow/{action}"), 404)
        assert (theirs["detail"], theirs["type"]) == (missing["detail"], missing["type"])
    demo_workflow.refresh_from_db()
    assert not demo_workflow.archived


def test_a_workflow_archived_on_the_page_is_restored_through_the_api(
    operator: User, demo_workflow: Workflow
) -> None:
    services.workflow_set_archived(workflow_id=demo_workflow.pk, user=operator, archived=True)

    restored = Api(make_token(operator)).post(f"/workflows/{SLUG}/restore")

    assert restored.json()["archived"] is False
    demo_workflow.refresh_from_db()
    assert not demo_workflow.archived


def test_archive_and_restore_are_in_the_openapi_document_with_their_scope(client: Client) -> None:
    paths = json.loads(client.get("/api/v1/openapi.json").content)["paths"]

    for action in ("archive", "restore"):
        operation = paths[f"/api/v1/workflows/{{slug}}/{action}"]["post"]
        assert "Scope: ``workflows:write``" in operation["description"], action
        assert operation["summary"][0].isupper(), action
        answer = operation["responses"]["200"]["content"]["application/json"]["schema"]
        assert answer["$ref"].endswith("/WorkflowDetailOut")
