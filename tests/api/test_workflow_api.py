"""Managing workflows over the API: the editor's services, its permissions, its refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import Group, User
from django.test import Client

from pandaweb.api.services import TokenError
from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from sessions import services
from sessions.models import SessionTemplate
from sessions.services import template_mark_stale
from tests.api.conftest import Api, make_token
from tests.api.test_api import problem
from tests.factories import user_with_role
from tests.sessions.conftest import publish, session_document
from workflows import services as workflow_services
from workflows.models import Credential, Workflow, WorkflowVersion

pytestmark = pytest.mark.django_db

# What the scraping client corrupted: entities, markup, both kinds of quotes.
TRICKY = """Pay & settle <b>"invoices"</b> 'now' &amp; later"""
GOTO = {"id": "open", "type": "goto", "url": "http://127.0.0.1:8001/login"}
# Reads like paying but is not marked irreversible: a warning, not a problem.
PAY = {"id": "pay", "type": "click", "target": {"role": "button", "name": "Submit payment"}}


def workflow_file(**overrides: Any) -> dict[str, Any]:
    return {
        "pandaweb": 1,
        "name": "Pay an invoice",
        "slug": "pay",
        "settings": {"allowed_hosts": ["127.0.0.1:8001"]},
        "steps": [GOTO],
        **overrides,
    }


def post_file(api: Api, text: str, content_type: str = "application/yaml") -> Any:
    return api.client.post(
        "/api/v1/workflows/import",
        text,
        content_type=content_type,
        headers={"Authorization": f"Bearer {api.token}"},
    )


def patch(api: Api, path: str, body: dict[str, Any]) -> Any:
    return api.client.patch(
        f"/api/v1{path}",
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {api.token}"},
    )


@pytest.fixture
def author(operator: User) -> Api:
    return Api(make_token(operator))


@pytest.fixture
def reviewer(db: None) -> User:
    return user_with_role(Role.REVIEWERS, username="rory")


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The tasks dispatched (none runs here)."""
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(
        services.templates, "dispatch", lambda task, queue=None, **kwargs: sent.append(kwargs)
    )
    return sent


# Import ------------------------------------------------------------------------------------------


def test_it_imports_a_yaml_file_as_the_draft_of_a_new_workflow(author: Api, operator: User) -> None:
    response = post_file(author, yaml.safe_dump(workflow_file()))

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["slug"], body["name"], body["has_draft"]) == ("pay", "Pay an invoice", True)
    assert body["latest_version"] is None
    workflow = Workflow.objects.get(slug="pay")
    assert workflow.owner == operator
    assert workflow.versions.get().status == WorkflowVersion.Status.DRAFT
    event = AuditEvent.objects.get(action="workflow.imported")
    assert event.actor == operator
    assert event.extra["via"]["channel"] == "api"


def test_it_imports_json_and_the_same_file_again_changes_nothing(author: Api) -> None:
    text = json.dumps(workflow_file())
    assert post_file(author, text, "application/json").status_code == 201
    published = author.post("/workflows/pay/publish", {"message": "first"})
    assert published.status_code == 201, published.content

    again = post_file(author, text, "application/json")

    assert again.status_code == 200, again.content
    assert (again.json()["has_draft"], again.json()["latest_version"]) == (False, 1)
    assert AuditEvent.objects.filter(action="workflow.imported").count() == 1


def test_a_refused_file_names_each_problem_by_path_and_line(author: Api) -> None:
    text = yaml.safe_dump(
        workflow_file(
            slug="Not A Slug",
            steps=[GOTO, {"id": "click", "type": "click", "target": {"role": "buton"}}],
        ),
        sort_keys=False,
    )

    document = problem(post_file(author, text), 422)

    assert document["detail"] == "the file was not imported"
    by_field = {e["field"]: e for e in document["errors"]}
    assert set(by_field) == {"slug", "steps.1.target.role"}
    assert by_field["slug"]["line"] == 3
    assert by_field["steps.1.target.role"]["where"] == "step 2 'click', field target.role"
    assert by_field["steps.1.target.role"]["line"] == text.splitlines().index("    role: buton") + 1
    assert not Workflow.objects.exists()


def test_a_file_that_is_not_a_workflow_is_refused_as_a_whole(author: Api) -> None:
    document = problem(post_file(author, "just: [text"), 422)

    assert [e["field"] for e in document["errors"]] == ["file"]
    assert document["errors"][0]["message"].startswith("not valid YAML")


def test_managing_workflows_needs_the_write_scope(operator: User, author: Api) -> None:
    post_file(author, yaml.safe_dump(workflow_file()))
    reader = Api(make_token(operator, ["workflows:read"]))

    for response in (
        post_file(reader, yaml.safe_dump(workflow_file(name="Changed"))),
        reader.post("/workflows/pay/draft"),
        patch(reader, "/workflows/pay/settings", {"name": "Changed"}),
        reader.post("/workflows/pay/publish", {"message": "first"}),
    ):
        assert problem(response, 403)["type"].endswith("/missing-scope")
    assert Workflow.objects.get().name == "Pay an invoice"
    assert not WorkflowVersion.objects.filter(status="published").exists()


def a_reviewers_token(person: User, scopes: list[str]) -> Api:
    """A token made while ``person`` was an operator, who is a reviewer now (a reviewer cannot
    make a token with scopes beyond their role in the first place)."""
    with pytest.raises(TokenError):
        make_token(person, scopes)
    person.groups.set([Group.objects.get(name=Role.OPERATORS.value)])
    # A fresh instance: a user caches its permissions.
    token = make_token(User.objects.get(pk=person.pk), scopes)
    person.groups.set([Group.objects.get(name=Role.REVIEWERS.value)])
    return Api(token)


def test_a_reviewers_token_cannot_change_workflows_whatever_its_scopes(
    reviewer: User, author: Api
) -> None:
    post_file(author, yaml.safe_dump(workflow_file()))
    api = a_reviewers_token(reviewer, ["workflows:read", "workflows:write"])

    refused = problem(patch(api, "/workflows/pay/settings", {"name": "Mine"}), 403)
    assert refused["type"].endswith("/scope-beyond-role")
    assert problem(api.post("/workflows/pay/publish", {"message": "x"}), 403)
    assert problem(post_file(api, yaml.safe_dump(workflow_file(name="Mine"))), 403)
    assert Workflow.objects.get().name == "Pay an invoice"
    assert not WorkflowVersion.objects.filter(status="published").exists()
    # Reading is what a reviewer may do.
    assert api.get("/workflows/pay/draft").status_code == 200


def test_names_with_markup_characters_round_trip_exactly(author: Api) -> None:
    imported = post_file(author, yaml.safe_dump(workflow_file(name=TRICKY, description=TRICKY)))
    assert imported.json()["name"] == TRICKY
    author.post("/workflows/pay/publish", {"message": TRICKY})

    renamed = TRICKY + " & <more>"
    assert patch(author, "/workflows/pay/settings", {"name": renamed}).json()["name"] == renamed
    draft = author.get("/workflows/pay/draft").json()
    assert draft["document"]["name"] == renamed
    assert draft["document"]["description"] == TRICKY
    author.post("/workflows/pay/publish", {"message": "renamed"})

    assert Workflow.objects.get().name == renamed
    assert author.get("/workflows/pay").json()["name"] == renamed
    assert author.get("/workflows/pay/versions").json()[1]["message"] == TRICKY
    exported = yaml.safe_load(author.get("/workflows/pay/versions/2/yaml").content)
    assert (exported["name"], exported["description"]) == (renamed, TRICKY)
    # The exported file imports as it is: the same content, nothing to do.
    assert post_file(author, yaml.safe_dump(exported)).status_code == 200


# The draft and settings -------------------------------------------------------------------------


def test_a_draft_is_started_once_from_the_latest_version(author: Api, operator: User) -> None:
    post_file(author, yaml.safe_dump(workflow_file()))
    author.post("/workflows/pay/publish", {"message": "first"})
    assert problem(author.get("/workflows/pay/draft"), 404)

    started = author.post("/workflows/pay/draft")
    again = author.post("/workflows/pay/draft")

    assert (started.status_code, again.status_code) == (201, 200)
    assert started.json()["document"]["steps"] == [GOTO]
    assert started.json()["problems"] == []
    assert WorkflowVersion.objects.filter(status="draft").count() == 1
    event = AuditEvent.objects.get(action="workflow.draft_started")
    assert event.actor == operator


def test_settings_change_the_draft_and_runs_keep_the_published_ones(author: Api) -> None:
    post_file(author, yaml.safe_dump(workflow_file()))
    author.post("/workflows/pay/publish", {"message": "first"})

    response = patch(
        author,
        "/workflows/pay/settings",
        {"step_budget": 12, "approval_reach": {"passkey": "always"}},
    )

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["settings"]["step_budget"], body["has_draft"]) == (12, True)
    assert body["settings"]["approval"]["passkey"] == "always"
    assert body["settings"]["allowed_hosts"] == ["127.0.0.1:8001"]  # not sent: kept
    published = WorkflowVersion.objects.get(number=1).document or {}
    assert published["settings"].get("step_budget") != 12
    assert AuditEvent.objects.filter(action="workflow.settings_changed").count() == 1
    # The same values again change nothing.
    assert patch(author, "/workflows/pay/settings", {"step_budget": 12}).json() == body
    last = AuditEvent.objects.filter(action="workflow.settings_changed").last()
    assert last is not None
    assert (last.before, last.after) == ({}, {})


def test_refused_settings_name_the_fields_the_request_sent(author: Api) -> None:
    post_file(author, yaml.safe_dump(workflow_file()))

    bad_hosts = problem(patch(author, "/workflows/pay/settings", {"allowed_hosts": ["a b"]}), 422)
    bad_group = problem(patch(author, "/workflows/pay/settings", {"reviewer_group": "Nobody"}), 422)
    bad_reach = problem(
        patch(author, "/workflows/pay/settings", {"approval_reach": {"passkey": "sometimes"}}),
        422,
    )
    bad_credential = problem(
        patch(author, "/workflows/pay/settings", {"credentials": ["nope"]}), 422
    )

    assert [e["field"] for e in bad_hosts["errors"]] == ["allowed_hosts"]
    assert bad_group["errors"] == [
        {"field": "reviewer_group", "message": "there is no group named 'Nobody'"}
    ]
    assert [e["field"] for e in bad_reach["errors"]] == ["approval_reach.passkey"]
    assert bad_credential["errors"] == [
        {"field": "credentials", "message": "no credential is named 'nope'"}
    ]
    assert not AuditEvent.objects.filter(action="workflow.settings_changed").exists()


def test_only_an_administrators_token_offers_a_workflow_to_agents(author: Api) -> None:
    post_file(author, yaml.safe_dump(workflow_file()))

    refused = problem(patch(author, "/workflows/pay/settings", {"offer_as_tool": True}), 422)

    assert refused["errors"][0]["field"] == "offer_as_tool"
    assert Workflow.objects.get().offer_as_tool is False


def test_an_archived_workflow_is_refused_until_it_is_restored(author: Api, operator: User) -> None:
    post_file(author, yaml.safe_dump(workflow_file()))
    workflow_services.workflow_set_archived(
        workflow_id=Workflow.objects.get().pk, user=operator, archived=True
    )

    for response in (
        patch(author, "/workflows/pay/settings", {"step_budget": 12}),
        author.post("/workflows/pay/publish", {"message": "first"}),
        post_file(author, yaml.safe_dump(workflow_file(name="Changed"))),
    ):
        document = problem(response, 409)
        assert document["type"].endswith("/workflow-refused")
        assert "archived" in document["detail"]
    workflow = Workflow.objects.get()
    assert (workflow.name, workflow.step_budget) == ("Pay an invoice", 50)


# Publishing, versions, differences --------------------------------------------------------------


def test_publishing_refuses_problems_by_path(author: Api) -> None:
    evil = {**GOTO, "url": "http://evil.example.test/"}
    hosts = ["127.0.0.1:8001", "evil.example.test"]
    # The file format checks hosts too: the draft gets its bad step from a settings change.
    post_file(
        author, yaml.safe_dump(workflow_file(steps=[evil], settings={"allowed_hosts": hosts}))
    )
    patch(author, "/workflows/pay/settings", {"allowed_hosts": ["127.0.0.1:8001"]})

    document = problem(author.post("/workflows/pay/publish", {"message": "first"}), 422)

    assert document["type"].endswith("/publish-refused")
    assert document["errors"] == [
        {
            "field": "steps.0.url",
            "where": "step 1 'open', field url",
            "message": "evil.example.test is not in the allowed hosts (127.0.0.1:8001)",
            "line": None,
        }
    ]
    assert author.get("/workflows/pay/draft").json()["problems"] == document["errors"]
    assert not WorkflowVersion.objects.filter(status="published").exists()


def test_publishing_with_warnings_needs_them_accepted(author: Api, operator: User) -> None:
    post_file(author, yaml.safe_dump(workflow_file(steps=[GOTO, PAY])))

    warned = problem(author.post("/workflows/pay/publish", {"message": "first"}), 409)
    assert warned["type"].endswith("/warnings-not-accepted")
    assert [w["field"] for w in warned["warnings"]] == ["steps.1.irreversible"]
    assert "reads like 'Submit'" in warned["warnings"][0]["message"]
    assert not WorkflowVersion.objects.filter(status="published").exists()

    published = author.post("/workflows/pay/publish", {"message": "first", "accept_warnings": True})

    assert published.status_code == 201, published.content
    assert (published.json()["number"], published.json()["author"]) == (1, operator.username)
    event = AuditEvent.objects.get(action="workflow.published")
    assert event.extra["accepted_warnings"] == [
        w["where"] + ": " + w["message"] for w in warned["warnings"]
    ]
    # Nothing left to publish: a retry says so.
    retry = problem(author.post("/workflows/pay/publish", {"message": "first"}), 409)
    assert "no draft" in retry["detail"]


def test_a_publish_retried_with_its_idempotency_key_answers_the_same_version(
    author: Api,
) -> None:
    post_file(author, yaml.safe_dump(workflow_file()))
    body = {"message": "first"}

    first = author.post("/workflows/pay/publish", body, **{"Idempotency-Key": "deploy-17"})
    retry = author.post("/workflows/pay/publish", body, **{"Idempotency-Key": "deploy-17"})
    other = author.post(
        "/workflows/pay/publish", {"message": "second"}, **{"Idempotency-Key": "deploy-17"}
    )

    assert (first.status_code, retry.status_code) == (201, 200)
    assert retry.json() == first.json()
    assert problem(other, 409)["type"].endswith("/idempotency-key-reused")
    assert AuditEvent.objects.filter(action="workflow.published").count() == 1
    assert WorkflowVersion.objects.filter(status="published").count() == 1


def test_publishing_needs_a_message(author: Api) -> None:
    post_file(author, yaml.safe_dump(workflow_file()))

    document = problem(author.post("/workflows/pay/publish", {"message": "  "}), 422)

    assert document["errors"] == [
        {"field": "message", "message": "say what changed in this version"}
    ]


def test_it_lists_versions_and_the_difference_between_two(author: Api) -> None:
    post_file(author, yaml.safe_dump(workflow_file()))
    author.post("/workflows/pay/publish", {"message": "first"})
    patch(author, "/workflows/pay/settings", {"step_budget": 12})
    author.post("/workflows/pay/publish", {"message": "a tighter budget"})

    listed = author.get("/workflows/pay/versions").json()
    diff = author.get("/workflows/pay/diff", {"from": "1", "to": "2"}).json()

    assert [(v["number"], v["message"]) for v in listed] == [(2, "a tighter budget"), (1, "first")]
    assert listed[0]["links"]["self"] == "/api/v1/workflows/pay/versions/2"
    assert diff["entries"] == [
        {
            "section": "settings",
            "kind": "changed",
            "label": "Settings",
            "changes": [{"path": "step_budget", "old": None, "new": 12}],
            "note": "",
        }
    ]
    no_draft = problem(author.get("/workflows/pay/diff", {"from": "1"}), 422)
    assert no_draft["errors"] == [{"field": "to", "message": "there is no draft"}]
    unknown = problem(author.get("/workflows/pay/diff", {"from": "7", "to": "1"}), 422)
    assert unknown["errors"][0]["field"] == "from"


# The session template -----------------------------------------------------------------------------


@pytest.fixture
def downloads(operator: User, acme_credential: Credential) -> Workflow:
    return publish(operator, session_document("http://127.0.0.1:8001"))


def test_a_stale_session_template_is_rebaked_through_the_api(
    author: Api, operator: User, downloads: Workflow, queued: list[dict[str, Any]]
) -> None:
    version = downloads.versions.get(number=1)
    stale = SessionTemplate.objects.create(
        version=version, backend="local", status=SessionTemplate.Status.READY, state="x"
    )
    template_mark_stale(template_id=stale.pk, reason="run #1: the portal showed Log out")
    status = author.get(f"/workflows/{downloads.slug}/session-template").json()
    assert (status["status"], status["template"]) == ("stale", stale.pk)
    assert status["stale_reason"] == "run #1: the portal showed Log out"

    first = author.post(f"/workflows/{downloads.slug}/session-template/bake")
    second = author.post(f"/workflows/{downloads.slug}/session-template/bake")

    assert (first.status_code, second.status_code) == (202, 202)
    fresh = SessionTemplate.objects.get(status=SessionTemplate.Status.BAKING)
    assert first.json()["template"] == second.json()["template"] == fresh.pk
    assert (fresh.requested_by, fresh.version) == (operator, version)
    assert queued == [{"template_id": fresh.pk}]
    event = AuditEvent.objects.get(action="session_template.bake_requested")
    assert event.extra["via"]["channel"] == "api"


def test_rebaking_needs_its_scope_and_a_role_that_launches(
    operator: User, reviewer: User, downloads: Workflow, queued: list[dict[str, Any]]
) -> None:
    path = f"/workflows/{downloads.slug}/session-template/bake"
    without = Api(make_token(operator, ["workflows:read", "workflows:write", "runs:launch"]))
    as_reviewer = a_reviewers_token(reviewer, ["workflows:read", "session-templates:bake"])

    assert problem(without.post(path), 403)["type"].endswith("/missing-scope")
    assert problem(as_reviewer.post(path), 403)["type"].endswith("/scope-beyond-role")
    assert as_reviewer.get(f"/workflows/{downloads.slug}/session-template").json()["status"] == (
        "never baked"
    )
    assert not SessionTemplate.objects.exists()
    assert queued == []


def test_a_workflow_without_a_session_template_has_none_to_bake(
    author: Api, demo_workflow: Workflow, queued: list[dict[str, Any]]
) -> None:
    assert problem(author.get(f"/workflows/{demo_workflow.slug}/session-template"), 404)
    refused = problem(author.post(f"/workflows/{demo_workflow.slug}/session-template/bake"), 409)
    assert refused["detail"] == "nothing was baked: version 1 has no session template"
    assert queued == []


# The OpenAPI document -----------------------------------------------------------------------------


def test_every_workflow_endpoint_is_in_the_openapi_document_with_its_scope(
    client: Client,
) -> None:
    paths = json.loads(client.get("/api/v1/openapi.json").content)["paths"]

    expected = {
        ("/api/v1/workflows/import", "post"): "workflows:write",
        ("/api/v1/workflows/{slug}", "get"): "workflows:read",
        ("/api/v1/workflows/{slug}/draft", "get"): "workflows:read",
        ("/api/v1/workflows/{slug}/draft", "post"): "workflows:write",
        ("/api/v1/workflows/{slug}/settings", "patch"): "workflows:write",
        ("/api/v1/workflows/{slug}/publish", "post"): "workflows:write",
        ("/api/v1/workflows/{slug}/versions", "get"): "workflows:read",
        ("/api/v1/workflows/{slug}/diff", "get"): "workflows:read",
        ("/api/v1/workflows/{slug}/session-template", "get"): "workflows:read",
        ("/api/v1/workflows/{slug}/session-template/bake", "post"): "session-templates:bake",
    }
    for (path, method), scope in expected.items():
        operation = paths[path][method]
        assert f"Scope: ``{scope}``" in operation["description"], (path, method)
    import_body = paths["/api/v1/workflows/import"]["post"]["requestBody"]["content"]
    assert set(import_body) == {"application/yaml", "application/json"}
    diff_parameters = {
        p["name"] for p in paths["/api/v1/workflows/{slug}/diff"]["get"]["parameters"]
    }
    assert diff_parameters == {"slug", "from", "to"}
    operation_ids = [op["operationId"] for item in paths.values() for op in item.values()]
    assert len(operation_ids) == len(set(operation_ids))


def test_settings_refuse_null_and_stray_options_in_words(author: Api) -> None:
    post_file(author, yaml.safe_dump(workflow_file()))

    nulls = problem(
        patch(author, "/workflows/pay/settings", {"name": None, "credentials": None}), 422
    )
    stray = problem(
        patch(author, "/workflows/pay/settings", {"approval_reach": {"quorum": 5}}), 422
    )

    assert {e["field"] for e in nulls["errors"]} == {"name", "credentials"}
    assert [e["field"] for e in stray["errors"]] == ["approval_reach.quorum"]
    assert Workflow.objects.get(slug="pay").approval_quorum == 1
