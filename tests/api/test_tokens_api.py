"""Tokens and service accounts over the API: the token pages' services and rules, and a token
that never makes a token stronger than itself."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from pandaweb.api.models import ApiToken, ServiceAccount
from pandaweb.api.services import token_authenticate, token_create
from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from tests.api.conftest import Api, make_token
from tests.api.test_api import problem
from tests.factories import user_with_role

pytestmark = pytest.mark.django_db

MANAGING = ["tokens:read", "tokens:write"]


@pytest.fixture
def admin(db: None) -> User:
    return user_with_role(Role.ADMINS, username="ada")


def fields(document: dict[str, Any]) -> dict[str, str]:
    """Each field's messages, one after the other."""
    found: dict[str, list[str]] = {}
    for error in document["errors"]:
        found.setdefault(error["field"], []).append(error["message"])
    return {field: " ".join(messages) for field, messages in found.items()}


def test_it_lists_the_owners_tokens_and_never_a_secret(operator: User, reviewer: User) -> None:
    raw = make_token(operator, [*MANAGING, "runs:read"])
    other = make_token(operator, ["runs:launch"])
    make_token(reviewer, ["approvals:read"])

    answer = Api(raw).get("/tokens/")

    listed = answer.json()
    assert [t["owner"] for t in listed] == ["olivia", "olivia"]
    assert [t["scopes"] for t in listed] == [
        ["runs:launch"],
        ["runs:read", "tokens:read", "tokens:write"],
    ]
    assert listed[0]["prefix"] == other[:11]
    assert all("secret" not in t for t in listed)
    assert raw not in answer.content.decode()
    assert other not in answer.content.decode()


def test_a_token_makes_a_token_within_its_own_scopes_shown_once(operator: User) -> None:
    api = Api(make_token(operator, [*MANAGING, "runs:read", "runs:launch"]))

    made = api.post("/tokens/", {"name": "erp", "scopes": ["runs:read"]})

    assert made.status_code == 201, made.content
    secret = made.json()["secret"]
    context = token_authenticate(secret)
    assert context is not None
    assert context.user == operator
    assert sorted(context.scopes) == ["runs:read"]
    assert secret not in api.get("/tokens/").content.decode()
    event = AuditEvent.objects.get(action="api_token.created", after__name="erp")
    assert (event.actor, event.extra["via"]["channel"]) == (operator, "api")
    assert secret not in json.dumps(event.after)


def test_a_token_never_makes_a_stronger_one(operator: User) -> None:
    expires = timezone.now() + timedelta(days=1)
    minting, raw = token_create(
        actor=operator, owner=operator, name="short", scopes=[*MANAGING, "runs:read"],
        expires_at=expires,
    )  # fmt: skip
    api = Api(raw)

    more_scopes = problem(api.post("/tokens/", {"name": "x", "scopes": ["runs:launch"]}), 422)
    forever = problem(api.post("/tokens/", {"name": "x", "scopes": ["runs:read"]}), 422)
    later = problem(
        api.post(
            "/tokens/",
            {
                "name": "x",
                "scopes": ["runs:read"],
                "expires_at": (expires + timedelta(days=1)).isoformat(),
            },
        ),
        422,
    )

    assert "The token making it may not use: runs:launch" in fields(more_scopes)["scopes"]
    assert "must expire by then too" in fields(forever)["expires_at"]
    assert "must expire by then too" in fields(later)["expires_at"]
    assert list(ApiToken.objects.all()) == [minting]
    within = api.post(
        "/tokens/",
        {"name": "x", "scopes": ["runs:read"], "expires_at": expires.isoformat()},
    )
    assert within.status_code == 201, within.content


def test_the_owners_role_caps_what_a_token_makes(reviewer: User) -> None:
    api = Api(make_token(reviewer, [*MANAGING, "approvals:decide"]))

    refused = problem(api.post("/tokens/", {"name": "x", "scopes": ["runs:launch"]}), 422)

    assert fields(refused)["scopes"].startswith("rory's role does not allow: runs:launch. ")
    assert ApiToken.objects.count() == 1


def test_bad_input_is_refused_in_words_with_its_field(operator: User) -> None:
    api = Api(make_token(operator, MANAGING))

    refused = problem(api.post("/tokens/", {"name": " ", "scopes": ["root"]}), 422)
    not_a_time = problem(
        api.post("/tokens/", {"name": "x", "scopes": ["tokens:read"], "expires_at": "soon"}), 422
    )
    past = problem(
        api.post(
            "/tokens/", {"name": "x", "scopes": ["tokens:read"], "expires_at": "2001-01-01T00:00"}
        ),
        422,
    )

    assert fields(refused) == {"name": "Give the token a name.", "scopes": "Unknown scopes: root."}
    assert list(fields(not_a_time)) == ["expires_at"]
    assert fields(past) == {"expires_at": "The expiry must be in the future."}
    assert ApiToken.objects.count() == 1


def test_tokens_need_their_scope_but_no_role(operator: User, stranger: User) -> None:
    reading = Api(make_token(operator, ["tokens:read"]))
    roleless = Api(make_token(stranger, MANAGING))

    refused = problem(reading.post("/tokens/", {"name": "x", "scopes": ["tokens:read"]}), 403)

    assert refused["type"].endswith("/missing-scope")
    assert problem(Api(make_token(operator, ["runs:read"])).get("/tokens/"), 403)
    assert [t["owner"] for t in roleless.get("/tokens/").json()] == ["sam"]


def test_a_token_revokes_its_owners_tokens_and_itself_but_no_one_elses(
    operator: User, reviewer: User
) -> None:
    raw = make_token(operator, MANAGING)
    api = Api(raw)
    spare, _ = token_create(
        actor=operator, owner=operator, name="spare", scopes=["runs:read"], expires_at=None
    )
    theirs, _ = token_create(
        actor=reviewer, owner=reviewer, name="theirs", scopes=["approvals:read"], expires_at=None
    )

    revoked = api.post(f"/tokens/{spare.pk}/revoke")
    again = api.post(f"/tokens/{spare.pk}/revoke")
    not_mine = api.post(f"/tokens/{theirs.pk}/revoke")

    assert revoked.status_code == again.status_code == 200
    assert revoked.json()["revoked_by"] == "olivia"
    assert AuditEvent.objects.filter(action="api_token.revoked").count() == 1
    assert problem(not_mine, 404)["detail"] == "no such object, or not yours to see"
    theirs.refresh_from_db()
    assert theirs.revoked_at is None
    own = ApiToken.objects.get(prefix=raw[:11])
    assert api.post(f"/tokens/{own.pk}/revoke").status_code == 200
    assert problem(api.get("/tokens/"), 401)


def test_an_admin_manages_service_accounts_and_their_tokens(admin: User) -> None:
    api = Api(make_token(admin, [*MANAGING, "runs:launch", "approvals:decide"]))

    account = api.post("/service-accounts/", {"username": "erp", "roles": ["Operators"]})
    account_id = account.json()["id"]
    made = api.post(
        f"/service-accounts/{account_id}/tokens", {"name": "erp-prod", "scopes": ["runs:launch"]}
    )
    beyond_role = problem(
        api.post(
            f"/service-accounts/{account_id}/tokens", {"name": "x", "scopes": ["approvals:decide"]}
        ),
        422,
    )
    beyond_token = problem(
        api.post(f"/service-accounts/{account_id}/tokens", {"name": "x", "scopes": ["runs:read"]}),
        422,
    )
    listed = api.get("/service-accounts/")

    assert account.status_code == 201, account.content
    assert made.status_code == 201, made.content
    user = ServiceAccount.objects.get().user
    assert not user.has_usable_password()
    secret = made.json()["secret"]
    context = token_authenticate(secret)
    assert context is not None
    assert (context.user, context.kind) == (user, "service")
    assert "erp's role does not allow: approvals:decide." in fields(beyond_role)["scopes"]
    assert "may not use: runs:read" in fields(beyond_token)["scopes"]
    [entry] = listed.json()
    assert (entry["username"], entry["roles"]) == ("erp", ["Operators"])
    assert [t["name"] for t in entry["tokens"]] == ["erp-prod"]
    assert secret not in listed.content.decode()
    revoked = api.post(f"/tokens/{made.json()['id']}/revoke")
    assert revoked.json()["revoked_by"] == "ada"
    assert token_authenticate(secret) is None
    actions = set(AuditEvent.objects.filter(actor=admin).values_list("action", flat=True))
    assert {"service_account.created", "api_token.created", "api_token.revoked"} <= actions


def test_only_admins_manage_service_accounts(admin: User, operator: User) -> None:
    account = Api(make_token(admin, MANAGING)).post(
        "/service-accounts/", {"username": "erp", "roles": ["Operators"]}
    )
    api = Api(make_token(operator, [*MANAGING, "runs:launch"]))
    path = f"/service-accounts/{account.json()['id']}/tokens"

    refusals = [
        api.get("/service-accounts/"),
        api.post("/service-accounts/", {"username": "crm", "roles": ["Operators"]}),
        api.post(path, {"name": "x", "scopes": ["runs:launch"]}),
        api.post("/service-accounts/999/tokens", {"name": "x", "scopes": ["runs:launch"]}),
    ]

    for refused in refusals:
        assert problem(refused, 403)["detail"] == "service accounts are managed by admins"
    assert ServiceAccount.objects.count() == 1
    assert not ApiToken.objects.filter(user__service_account__isnull=False).exists()


def test_a_service_account_is_refused_in_words(admin: User) -> None:
    api = Api(make_token(admin, MANAGING))

    refused = problem(api.post("/service-accounts/", {"username": " ", "roles": ["Kings"]}), 422)
    taken = problem(api.post("/service-accounts/", {"username": "ADA", "roles": ["Admins"]}), 422)

    assert set(fields(refused)) == {"username", "roles"}
    assert (
        fields(refused)["roles"] == "Choose roles from: Admins, Compliance, Operators, Reviewers."
    )
    assert fields(taken) == {"username": "'ADA' is taken."}
    assert not ServiceAccount.objects.exists()


def test_every_token_endpoint_is_in_the_openapi_document_with_a_summary_and_its_scope(
    client: Client,
) -> None:
    paths = json.loads(client.get("/api/v1/openapi.json").content)["paths"]
    expected = {
        ("/api/v1/tokens/", "get"): "tokens:read",
        ("/api/v1/tokens/", "post"): "tokens:write",
        ("/api/v1/tokens/{token_id}/revoke", "post"): "tokens:write",
        ("/api/v1/service-accounts/", "get"): "tokens:read",
        ("/api/v1/service-accounts/", "post"): "tokens:write",
        ("/api/v1/service-accounts/{account_id}/tokens", "post"): "tokens:write",
    }
    for (path, method), scope in expected.items():
        operation = paths[path][method]
        assert operation["summary"][0].isupper(), (path, method)
        assert f"Scope: ``{scope}``" in operation["description"], (path, method)
