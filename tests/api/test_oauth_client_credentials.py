"""Machine identities with OAuth 2.0 client credentials: a client made by an admin asks
/oauth/token/ for short-lived access tokens and uses them wherever an API token works (the API,
the event stream, MCP over HTTP), bounded by its scopes and its owner's role."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application

from pandaweb.api.mcp_asgi import McpEndpoint
from pandaweb.api.models import OAuthClient
from pandaweb.api.services import (
    TokenError,
    oauth_client_create,
    oauth_client_revoke,
    service_account_create,
    token_authenticate,
)
from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from sessions.models import Run
from tests.api.conftest import Api
from tests.api.test_mcp import offered
from tests.factories import user_with_role
from workflows.models import Workflow

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(db: None) -> User:
    return user_with_role(Role.ADMINS, username="ada")


@pytest.fixture
def erp(admin: User) -> User:
    """A service account that may launch and read runs (Operators), not decide approvals."""
    return service_account_create(actor=admin, username="erp", roles=["Operators"]).user


def make_client(admin: User, owner: User, scopes: list[str]) -> tuple[str, str]:
    client, secret = oauth_client_create(actor=admin, owner=owner, name="nightly", scopes=scopes)
    return client.application.client_id, secret


def token_request(client_id: str, secret: str, scope: str = "") -> Any:
    """The token endpoint over HTTP, authenticated with HTTP Basic as RFC 6749 prefers."""
    basic = base64.b64encode(f"{client_id}:{secret}".encode()).decode()
    body = {"grant_type": "client_credentials", **({"scope": scope} if scope else {})}
    return Client().post("/oauth/token/", body, headers={"Authorization": f"Basic {basic}"})


def access_token(client_id: str, secret: str, scope: str = "") -> str:
    answer = token_request(client_id, secret, scope)
    assert answer.status_code == 200, answer.content
    token: str = answer.json()["access_token"]
    return token


def test_a_client_gets_a_short_lived_token_and_reads_runs_with_it(erp: User, admin: User) -> None:
    client_id, secret = make_client(admin, erp, ["runs:read", "workflows:read"])

    answer = token_request(client_id, secret)

    document = answer.json()
    assert document["token_type"] == "Bearer"
    assert document["expires_in"] == 600
    assert set(document["scope"].split()) == {"runs:read", "workflows:read"}
    assert document["access_token"].startswith("pwo_")
    assert "refresh_token" not in document
    assert Api(document["access_token"]).get("/runs/").status_code == 200
    # Only the SHA-256 of the token is stored, as for API tokens.
    assert AccessToken.objects.get().token == ""


def test_the_client_secret_also_works_in_the_body(erp: User, admin: User) -> None:
    client_id, secret = make_client(admin, erp, ["runs:read"])
    answer = Client().post(
        "/oauth/token/",
        {"grant_type": "client_credentials", "client_id": client_id, "client_secret": secret},
    )
    assert answer.status_code == 200


def test_it_refuses_scopes_beyond_the_client_and_the_role_caps_the_rest(
    erp: User, admin: User
) -> None:
    client_id, secret = make_client(admin, erp, ["runs:read", "runs:launch"])

    beyond = token_request(client_id, secret, "runs:read audit:read")
    narrower = access_token(client_id, secret, "runs:read")

    assert (beyond.status_code, beyond.json()["error"]) == (400, "invalid_scope")
    api = Api(narrower)
    assert api.get("/runs/").status_code == 200
    assert (
        api.post("/runs/", {"workflow": "x", "inputs": {}}).json()["type"].endswith("missing-scope")
    )
    # The owner's role is read on every request, as for an API token.
    both = Api(access_token(client_id, secret))
    erp.groups.clear()
    refused = both.get("/runs/")
    assert refused.status_code == 403
    assert refused.json()["detail"] == "the token's owner's role no longer allows 'runs:read'"


def test_a_client_is_made_only_by_an_admin_within_its_owners_role(
    erp: User, admin: User, operator: User
) -> None:
    with pytest.raises(PermissionDenied):
        oauth_client_create(actor=operator, owner=operator, name="mine", scopes=["runs:read"])
    with pytest.raises(TokenError) as refused:
        oauth_client_create(actor=admin, owner=erp, name="x", scopes=["approvals:decide"])
    assert refused.value.field_errors == {
        "scopes": ["erp's role does not allow: approvals:decide."]
    }
    # A person may be the owner too; their role bounds it.
    client, _ = oauth_client_create(actor=admin, owner=operator, name="cli", scopes=["runs:read"])
    assert client.application.user == operator
    assert client.application.authorization_grant_type == Application.GRANT_CLIENT_CREDENTIALS
    created = AuditEvent.objects.get(action="oauth_client.created")
    assert created.actor_id == admin.pk
    # The secret is not in it.
    assert created.after == {
        "owner": "olivia",
        "name": "cli",
        "client_id": client.application.client_id,
        "scopes": ["runs:read"],
    }


def test_a_wrong_secret_gets_no_token_and_is_recorded(erp: User, admin: User) -> None:
    client_id, _ = make_client(admin, erp, ["runs:read"])

    answer = token_request(client_id, "not-the-secret")
    unknown = token_request("no-such-client", "whatever")

    assert (answer.status_code, answer.json()["error"]) == (401, "invalid_client")
    assert unknown.status_code == 401
    assert not AccessToken.objects.exists()
    # Only the known client's failure is in the audit trail; an unknown id names nothing.
    failed = AuditEvent.objects.get(action="oauth_client.authentication_failed")
    assert failed.after == {
        "client_id": client_id,
        "name": "nightly",
        "reason": "wrong client secret",
    }


def test_an_expired_token_is_refused_in_words(erp: User, admin: User) -> None:
    client_id, secret = make_client(admin, erp, ["runs:read"])
    with time_machine.travel(timezone.now(), tick=False) as clock:
        api = Api(access_token(client_id, secret))
        clock.shift(timedelta(minutes=9))
        assert api.get("/runs/").status_code == 200
        clock.shift(timedelta(minutes=2))

        refused = api.get("/runs/")

        assert refused.status_code == 401
        assert refused["WWW-Authenticate"] == 'Bearer realm="pandaweb"'
        assert refused.json()["detail"].startswith("this access token expired at ")
        assert refused.json()["detail"].endswith("; ask /oauth/token/ for a new one")
        # The next token works, and the client's expired one is forgotten.
        assert Api(access_token(client_id, secret)).get("/runs/").status_code == 200
        assert AccessToken.objects.count() == 1


def test_a_revoked_client_gets_no_token_and_its_tokens_stop_at_once(erp: User, admin: User) -> None:
    client_id, secret = make_client(admin, erp, ["runs:read"])
    api = Api(access_token(client_id, secret))
    client = OAuthClient.objects.get()

    with pytest.raises(PermissionDenied):
        oauth_client_revoke(client_pk=client.pk, actor=erp)
    oauth_client_revoke(client_pk=client.pk, actor=admin)
    oauth_client_revoke(client_pk=client.pk, actor=admin)  # idempotent

    refused = api.get("/runs/")
    assert refused.status_code == 401
    assert refused.json()["detail"] == "this access token's OAuth client was revoked"
    assert token_request(client_id, secret).status_code == 401
    assert AuditEvent.objects.filter(action="oauth_client.revoked").count() == 1
    failed = AuditEvent.objects.get(action="oauth_client.authentication_failed")
    assert failed.after == {
        "client_id": client_id,
        "name": "nightly",
        "reason": "the client is revoked",
    }


def test_an_inactive_owner_stops_the_client(erp: User, admin: User) -> None:
    client_id, secret = make_client(admin, erp, ["runs:read"])
    raw = access_token(client_id, secret)
    User.objects.filter(pk=erp.pk).update(is_active=False)

    assert token_authenticate(raw) is None
    assert token_request(client_id, secret).status_code == 401


def test_an_application_made_outside_pandaweb_gets_no_token(erp: User) -> None:
    # The library's admin pages could make one; only the clients pandaweb made (with scopes and
    # revocation) are served.
    application = Application.objects.create(
        name="stray",
        user=erp,
        client_type=Application.CLIENT_CONFIDENTIAL,
        authorization_grant_type=Application.GRANT_CLIENT_CREDENTIALS,
        client_secret="stray-secret",
    )
    assert token_request(application.client_id, "stray-secret").status_code == 401


def test_other_grants_are_refused(admin: User, operator: User) -> None:
    operator.set_password("right-password")
    operator.save()
    client_id, secret = make_client(admin, operator, ["runs:read"])
    basic = base64.b64encode(f"{client_id}:{secret}".encode()).decode()
    answer = Client().post(
        "/oauth/token/",
        {"grant_type": "password", "username": operator.username, "password": "right-password"},
        headers={"Authorization": f"Basic {basic}"},
    )
    assert (answer.status_code, answer.json()["error"]) == (400, "unauthorized_client")
    assert not AccessToken.objects.exists()


def test_rate_limits_count_per_client_across_its_tokens(
    erp: User, admin: User, settings: Any
) -> None:
    settings.API_RATE_LIMIT_PER_MINUTE = 2
    client_id, secret = make_client(admin, erp, ["runs:read"])
    with time_machine.travel(timezone.now().replace(second=1), tick=False):
        first, second = Api(access_token(client_id, secret)), Api(access_token(client_id, secret))
        codes = [first.get("/runs/").status_code, second.get("/runs/").status_code]
        codes.append(second.get("/runs/").status_code)
    assert codes == [200, 200, 429]


@pytest.mark.usefixtures("no_background_runs")
def test_a_launch_names_the_client_in_the_audit_trail(admin: User, demo_workflow: Workflow) -> None:
    erp = service_account_create(actor=admin, username="erp", roles=["Operators"]).user
    client_id, secret = make_client(admin, erp, ["runs:launch"])

    launched = Api(access_token(client_id, secret)).post(
        "/runs/",
        {"workflow": "acme-pay-invoice", "inputs": {"invoice": "INV-1001", "amount": "12.50"}},
    )

    assert launched.status_code == 201, launched.content
    run = Run.objects.get()
    assert run.launched_by == erp
    via = AuditEvent.objects.get(action="run.launched").extra["via"]
    assert via == {
        "channel": "api",
        "id": AccessToken.objects.get().pk,
        "name": "nightly",
        "kind": "oauth",
        "client_id": client_id,
    }


@pytest.mark.django_db(transaction=True)  # the stream reads on a thread of its own
def test_the_event_stream_takes_an_access_token(erp: User, admin: User) -> None:
    client_id, secret = make_client(admin, erp, ["runs:read"])
    good = Client().get(
        "/api/v1/events",
        headers={"Authorization": f"Bearer {access_token(client_id, secret)}"},
    )
    unknown = Client().get("/api/v1/events", headers={"Authorization": "Bearer pwo_unknown"})

    assert good.status_code == 200
    assert good["Content-Type"].startswith("text/event-stream")
    assert unknown.status_code == 401
    assert "unknown" in json.loads(unknown.content)["detail"]


def test_admins_make_and_revoke_clients_on_the_service_accounts_page(
    erp: User, admin: User
) -> None:
    page = Client()
    page.force_login(admin)
    account = erp.service_account

    made = page.post(
        "/account/service-accounts/",
        {"account": account.pk, "form": "oauth_client", "name": "nightly", "scopes": ["runs:read"]},
    )

    client = OAuthClient.objects.get()
    shown = made.context["new_client"]
    assert shown["client_id"] == client.application.client_id
    assert access_token(shown["client_id"], shown["secret"])
    # Shown once: the next page has only the hash.
    listing = page.get("/account/service-accounts/").content.decode()
    assert client.application.client_id in listing
    assert shown["secret"] not in listing
    page.post(f"/account/oauth-clients/{client.pk}/revoke/")
    client.refresh_from_db()
    assert client.revoked_by == admin


def test_the_command_makes_and_revokes_a_client(erp: User, admin: User, capsys: Any) -> None:
    call_command(
        "oauth_client", "create", "erp", "--name", "nightly", "--scope", "runs:read", "--by", "ada"
    )
    lines = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
    assert access_token(lines["client_id"], lines["client_secret"])

    call_command("oauth_client", "revoke", lines["client_id"], "--by", "ada")

    assert OAuthClient.objects.get().is_revoked
    with pytest.raises(CommandError, match="only admins"):
        call_command(
            "oauth_client", "create", "erp", "--name", "again", "--scope", "runs:read",
            "--by", "erp",
        )  # fmt: skip


# MCP over HTTP ------------------------------------------------------------------------------------


async def mcp_post(
    endpoint: McpEndpoint, token: str, message: dict[str, Any], session: str = ""
) -> tuple[int, dict[str, str], list[dict[str, Any]]]:
    """One JSON-RPC message to /mcp as a client sends it: the status, the headers and the
    messages of the answer's event stream."""
    sent: list[dict[str, Any]] = []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": json.dumps(message).encode()}
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(event: dict[str, Any]) -> None:
        sent.append(event)

    headers = [
        (b"authorization", f"Bearer {token}".encode()),
        (b"content-type", b"application/json"),
        (b"accept", b"application/json, text/event-stream"),
    ]
    if session:
        headers += [(b"mcp-session-id", session.encode())]
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/mcp",
        "raw_path": b"/mcp",
        "query_string": b"",
        "scheme": "http",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
        "headers": headers,
    }
    await endpoint(scope, receive, send)
    start = next(e for e in sent if e["type"] == "http.response.start")
    answer_headers = {k.decode(): v.decode() for k, v in start.get("headers", [])}
    body = b"".join(e.get("body", b"") for e in sent if e["type"] == "http.response.body")
    text = body.decode()
    if answer_headers.get("content-type", "").startswith("text/event-stream"):
        messages = [
            json.loads(line[len("data: ") :])
            for line in text.splitlines()
            if line.startswith("data: ") and line[len("data: ") :].strip()
        ]
    else:
        messages = [json.loads(text)] if text else []
    return start["status"], answer_headers, messages


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "erp-agent", "version": "1"},
    },
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("no_background_runs")
def test_mcp_over_http_takes_an_access_token_and_its_successor(
    admin: User, demo_workflow: Workflow
) -> None:
    offered(demo_workflow)
    erp = service_account_create(actor=admin, username="erp", roles=["Operators"]).user
    client_id, secret = make_client(admin, erp, ["tools:call"])
    first, second = access_token(client_id, secret), access_token(client_id, secret)

    async def talk() -> tuple[Any, ...]:
        endpoint = McpEndpoint()
        status, headers, _ = await mcp_post(endpoint, first, INITIALIZE)
        session = headers["mcp-session-id"]
        await mcp_post(
            endpoint,
            first,
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            session,
        )
        # The session belongs to the client: its next access token goes on with it.
        listed = await mcp_post(
            endpoint, second, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, session
        )
        refused = await mcp_post(endpoint, "pwo_unknown", INITIALIZE)
        return status, listed, refused

    status, listed, refused = asyncio.run(talk())

    assert status == 200
    assert listed[0] == 200
    assert [tool["name"] for tool in listed[2][0]["result"]["tools"]] == [
        "acme-pay-invoice",
        "run_status",
        "run_cancel",
    ]
    assert refused[0] == 401
    assert refused[2][0]["error"].startswith("this access token is unknown")
