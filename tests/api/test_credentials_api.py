"""Credentials over the API: the credentials page's form and services, values write-only."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User

from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from tests.api.conftest import Api, make_token
from tests.api.test_api import problem
from tests.factories import user_with_role
from workflows.models import Credential, Workflow
from workflows.services import vault

pytestmark = pytest.mark.django_db

SECRET = "s3cret-Portal-Pa55"
NEW_SECRET = "n3w-Portal-Pa55"
NEW_PORTAL = {
    "name": "bank-portal",
    "kind": "username_password",
    "description": "The bank's portal",
    "values": {"username": "treasury", "password": SECRET},
}


@pytest.fixture
def author(operator: User) -> Api:
    return Api(make_token(operator))


def audit_text() -> str:
    return json.dumps(list(AuditEvent.objects.values("before", "after", "extra")), default=str)


def test_it_stores_a_credential_encrypted_and_never_answers_its_value(
    author: Api, operator: User
) -> None:
    response = author.post("/credentials/", NEW_PORTAL)

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["name"] == "bank-portal"
    assert body["kind"] == "username_password"
    assert body["created_by"] == operator.username
    assert "values" not in body
    assert SECRET not in response.content.decode()
    credential = Credential.objects.get(name="bank-portal")
    assert vault().open(credential.ciphertext) == {"username": "treasury", "password": SECRET}
    event = AuditEvent.objects.get(action="credential.created")
    assert event.after == {
        "name": "bank-portal",
        "kind": "username_password",
        "description": "The bank's portal",
    }
    assert event.extra["via"]["channel"] == "api"
    assert SECRET not in audit_text()


def test_it_lists_credentials_with_the_workflows_using_them_and_no_value(
    operator: User, demo_workflow: Workflow
) -> None:
    reader = Api(make_token(user_with_role(Role.REVIEWERS, username="rory"), ["workflows:read"]))

    response = reader.get("/credentials/")

    assert response.status_code == 200
    [listed] = response.json()
    assert listed["name"] == "acme-portal"
    assert listed["used_by"] == [demo_workflow.slug]
    assert "portal-demo-2026" not in response.content.decode()


def test_it_replaces_a_value_and_keeps_the_name(author: Api, acme_credential: Credential) -> None:
    response = author.post(
        "/credentials/acme-portal/value",
        {"values": {"username": "acme-demo", "password": NEW_SECRET}},
    )

    assert response.status_code == 200, response.content
    assert NEW_SECRET not in response.content.decode()
    acme_credential.refresh_from_db()
    assert vault().open(acme_credential.ciphertext)["password"] == NEW_SECRET
    event = AuditEvent.objects.get(action="credential.value_replaced")
    assert event.after == {"name": "acme-portal"}
    assert NEW_SECRET not in audit_text()


def test_it_refuses_bad_input_by_field_without_repeating_the_value(
    author: Api, acme_credential: Credential
) -> None:
    bad = {**NEW_PORTAL, "name": "bank portal!", "values": {"username": "", "seed": SECRET}}

    refused = problem(author.post("/credentials/", bad), 422)

    assert {e["field"] for e in refused["errors"]} == {"name", "values.seed"}
    assert SECRET not in json.dumps(refused)
    empty = problem(author.post("/credentials/", {**bad, "name": "bank", "values": {}}), 422)
    assert empty["errors"] == [
        {"field": "values.username", "message": "this field is required"},
        {"field": "values.password", "message": "this field is required"},
    ]
    taken = problem(author.post("/credentials/", {**NEW_PORTAL, "name": "acme-portal"}), 422)
    assert taken["errors"] == [
        {"field": "name", "message": "a credential named 'acme-portal' exists"}
    ]
    long = problem(
        author.post("/credentials/acme-portal/value", {"values": {"password": "x" * 1001}}), 422
    )
    assert [e["field"] for e in long["errors"]] == ["values.password"]
    assert "x" * 1001 not in json.dumps(long)
    assert not Credential.objects.exclude(pk=acme_credential.pk).exists()
    assert not AuditEvent.objects.filter(action="credential.value_replaced").exists()


def test_it_needs_the_write_scope_and_the_authors_role(
    operator: User, acme_credential: Credential
) -> None:
    reader = Api(make_token(operator, ["workflows:read"]))
    missing = problem(reader.post("/credentials/", NEW_PORTAL), 403)
    writer = Api(make_token(operator, ["credentials:write"]))
    operator.groups.clear()
    beyond = problem(writer.post("/credentials/acme-portal/value", {"values": {}}), 403)

    assert missing["type"].endswith("missing-scope")
    assert beyond["type"].endswith("scope-beyond-role")
    assert Credential.objects.count() == 1


def test_an_unknown_credential_is_not_found(author: Api) -> None:
    assert problem(author.post("/credentials/nope/value", {"values": {}}), 404)
