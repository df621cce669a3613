"""Webhook subscriptions and deliveries over the API: the webhooks pages' services, their
capability, their refusals in words and their audit events."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone

from pandaweb.api.services import TokenError
from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from pandaweb.webhooks import services
from pandaweb.webhooks.models import Attempt, Message, Subscription
from tests.api.conftest import Api, make_token
from tests.api.test_api import problem
from tests.factories import user_with_role
from tests.webhooks.conftest import Receiver, receiver
from workflows.models import Workflow

__all__ = ["receiver"]

pytestmark = pytest.mark.django_db

BODY = {"name": "ERP", "url": "http://127.0.0.1:9/hooks", "events": ["run.finished"]}


@pytest.fixture
def admin(db: None) -> User:
    return user_with_role(Role.ADMINS, username="ada")


@pytest.fixture
def api(admin: User) -> Api:
    return Api(make_token(admin, ["webhooks:read", "webhooks:write"]))


@pytest.fixture
def subscription(admin: User) -> Subscription:
    subscription, _ = services.subscription_create(
        user=admin, name="ERP", url="http://127.0.0.1:9/hooks", events=["run.finished"],
        workflow_id=None,
    )  # fmt: skip
    return subscription


def send(api: Api, method: str, path: str, body: Any = None) -> Any:
    return getattr(api.client, method)(
        f"/api/v1{path}",
        json.dumps(body) if body is not None else "",
        content_type="application/json",
        headers={"Authorization": f"Bearer {api.token}"},
    )


def message_of(subscription: Subscription, **fields: Any) -> Message:
    return Message.objects.create(
        subscription=subscription,
        msg_id=f"msg_{uuid.uuid4().hex}",
        event="run.finished",
        payload={"type": "run.finished", "data": {"run": 1}},
        next_attempt_at=timezone.now(),
        **fields,
    )


def test_an_admin_makes_a_subscription_and_sees_its_secret_once(api: Api, admin: User) -> None:
    made = api.post("/webhooks/", BODY)

    assert made.status_code == 201, made.content
    body = made.json()
    subscription = Subscription.objects.get()
    assert body["secret"].startswith("whsec_")
    assert body["secret"] == services.subscription_secret(subscription)
    assert body["workflow"] is None
    assert (body["name"], body["url"], body["events"]) == ("ERP", BODY["url"], ["run.finished"])
    listed = api.get("/webhooks/")
    one = api.get(f"/webhooks/{subscription.pk}")
    assert [s["id"] for s in listed.json()] == [subscription.pk]
    for answer in (listed, one):
        assert body["secret"] not in answer.content.decode()
        assert "secret" not in answer.content.decode()
    event = AuditEvent.objects.get(action="webhook.subscription_created")
    assert event.actor == admin
    assert event.extra["via"]["channel"] == "api"
    assert body["secret"] not in json.dumps(event.after)


def test_it_subscribes_for_one_workflow_by_its_slug(api: Api, demo_workflow: Workflow) -> None:
    made = api.post("/webhooks/", {**BODY, "workflow": demo_workflow.slug})

    assert made.status_code == 201, made.content
    assert made.json()["workflow"] == demo_workflow.slug
    assert Subscription.objects.get().workflow == demo_workflow


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"url": "ftp://erp.example.com/hooks"}, "url", "must start with http:// or https://"),
        ({"url": "http://erp example.com/hooks"}, "url", "The address is not a valid URL."),
        ({"url": "http://"}, "url", "The address is not a valid URL."),
        ({"name": "  "}, "name", "Give the subscription a name."),
        ({"name": "x" * 201}, "name", "at most 200 characters"),
        ({"events": []}, "events", "Choose at least one"),
        ({"events": ["run.exploded"]}, "events.0", "run.finished"),
        ({"workflow": "no-such-workflow"}, "workflow", "no workflow has the slug"),
    ],
)
def test_it_refuses_what_the_form_refuses_in_words(
    api: Api, change: dict[str, Any], field: str, message: str
) -> None:
    refused = problem(api.post("/webhooks/", {**BODY, **change}), 422)

    assert [e["field"] for e in refused["errors"]] == [field]
    assert message in refused["errors"][0]["message"]
    assert not Subscription.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="webhook.").exists()


def test_the_scope_and_the_role_behind_it_are_checked_first(
    admin: User, operator: User, subscription: Subscription
) -> None:
    reading = Api(make_token(admin, ["webhooks:read"]))

    assert problem(reading.post("/webhooks/", BODY), 403)["type"].endswith("/missing-scope")
    assert problem(send(reading, "delete", "/webhooks/999"), 403)["type"].endswith("/missing-scope")
    with pytest.raises(TokenError):
        make_token(operator, ["webhooks:read"])
    admin.groups.remove(Group.objects.get(name=Role.ADMINS.value))
    assert problem(reading.get("/webhooks/"), 403)["type"].endswith("/scope-beyond-role")
    assert Subscription.objects.count() == 1


def test_a_change_sends_the_fields_given_and_switches_it_off_at_once(
    api: Api, subscription: Subscription, demo_workflow: Workflow
) -> None:
    changed = send(
        api,
        "patch",
        f"/webhooks/{subscription.pk}",
        {"events": ["run.failed", "run.finished"], "workflow": demo_workflow.slug, "active": False},
    )

    assert changed.status_code == 200, changed.content
    subscription.refresh_from_db()
    assert subscription.events == ["run.failed", "run.finished"]
    assert subscription.workflow == demo_workflow
    assert subscription.name == "ERP"
    assert subscription.active is False
    assert changed.json()["disabled_reason"] == "switched off by a person"
    actions = AuditEvent.objects.filter(object_type="webhook_subscription").values_list(
        "action", flat=True
    )
    assert list(actions.order_by("pk"))[1:] == [
        "webhook.subscription_updated",
        "webhook.subscription_disabled",
    ]
    # The same values again change nothing and write nothing.
    send(api, "patch", f"/webhooks/{subscription.pk}", {"events": ["run.finished", "run.failed"]})
    assert actions.count() == 3


def test_a_refused_change_changes_nothing(api: Api, subscription: Subscription) -> None:
    bad = problem(
        send(api, "patch", f"/webhooks/{subscription.pk}", {"url": "mailto:x", "active": False}),
        422,
    )
    nulls = problem(send(api, "patch", f"/webhooks/{subscription.pk}", {"name": None}), 422)

    assert [e["field"] for e in bad["errors"]] == ["url"]
    assert nulls["errors"] == [
        {"field": "name", "message": "may not be null: leave it out to keep its value"}
    ]
    subscription.refresh_from_db()
    assert (subscription.url, subscription.active) == ("http://127.0.0.1:9/hooks", True)
    assert problem(send(api, "patch", "/webhooks/999", {"active": False}), 404)


def test_deleting_a_subscription_leaves_what_it_was_in_the_audit_trail(
    api: Api, subscription: Subscription, admin: User
) -> None:
    message_of(subscription)

    assert send(api, "delete", f"/webhooks/{subscription.pk}").status_code == 204

    assert not Subscription.objects.exists()
    assert not Message.objects.exists()
    event = AuditEvent.objects.get(action="webhook.subscription_deleted")
    assert event.actor == admin
    assert event.before is not None
    assert (event.before["url"], event.before["messages"]) == ("http://127.0.0.1:9/hooks", 1)
    assert problem(send(api, "delete", f"/webhooks/{subscription.pk}"), 404)


def test_a_new_secret_is_shown_once_and_replaces_the_old(
    api: Api, subscription: Subscription
) -> None:
    before = services.subscription_secret(subscription)

    renewed = api.post(f"/webhooks/{subscription.pk}/secret")

    subscription.refresh_from_db()
    secret = renewed.json()["secret"]
    assert secret == services.subscription_secret(subscription) != before
    assert secret not in api.get(f"/webhooks/{subscription.pk}").content.decode()
    assert AuditEvent.objects.filter(action="webhook.secret_rotated").count() == 1


def test_the_delivery_log_pages_by_cursor_and_filters(api: Api, subscription: Subscription) -> None:
    other, _ = services.subscription_create(
        user=subscription.created_by, name="Other", url="http://127.0.0.1:9/other",
        events=["run.failed"], workflow_id=None,
    )  # fmt: skip
    first, second = message_of(subscription), message_of(subscription)
    failed = message_of(subscription, status=Message.Status.FAILED)
    message_of(other)

    page = api.get("/webhooks/deliveries/", {"subscription": subscription.pk, "limit": 2}).json()
    rest = api.get(
        "/webhooks/deliveries/",
        {"subscription": subscription.pk, "limit": 2, "cursor": page["next_cursor"]},
    ).json()
    given_up = api.get("/webhooks/deliveries/", {"status": "failed"}).json()

    assert [m["id"] for m in page["items"]] == [failed.pk, second.pk]
    assert [m["id"] for m in rest["items"]] == [first.pk]
    assert rest["next_cursor"] is None
    assert [m["id"] for m in given_up["items"]] == [failed.pk]
    status = problem(api.get("/webhooks/deliveries/", {"status": "lost"}), 422)
    cursor = problem(api.get("/webhooks/deliveries/", {"cursor": "nonsense!"}), 422)
    assert [e["field"] for e in status["errors"]] == ["status"]
    assert cursor["errors"] == [{"field": "cursor", "message": "not a cursor"}]


def test_send_again_goes_through_the_outbox_with_the_same_webhook_id(
    admin: User, api: Api, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = api.post("/webhooks/", {**BODY, "url": receiver.url}).json()
    receiver.secret = made["secret"]
    message = message_of(Subscription.objects.get(), status=Message.Status.FAILED, attempts=5)
    queued: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(
        services, "dispatch", lambda task, queue=None, **kwargs: queued.append((task.name, kwargs))
    )

    answer = api.post(f"/webhooks/deliveries/{message.pk}/redeliver")

    assert answer.status_code == 202, answer.content
    assert answer.json()["status"] == "pending"
    assert queued == [("webhooks.deliver", {"message_id": message.pk, "manual": True})]
    assert receiver.received == []  # queued, not sent by the request
    services.message_deliver(**queued[0][1])  # what the worker does with it
    assert [r["headers"]["webhook-id"] for r in receiver.received] == [message.msg_id]
    assert receiver.received[0]["verified"]
    detail = api.get(f"/webhooks/deliveries/{message.pk}").json()
    assert detail["status"] == "delivered"
    assert [(a["ok"], a["manual"]) for a in detail["attempts_made"]] == [(True, True)]
    assert detail["payload"] == message.payload
    assert Attempt.objects.count() == 1
    event = AuditEvent.objects.get(action="webhook.redelivered")
    assert (event.actor, event.extra["via"]["channel"]) == (admin, "api")


def test_every_webhook_endpoint_is_in_the_openapi_document_with_a_summary_and_its_scope(
    client: Client,
) -> None:
    paths = json.loads(client.get("/api/v1/openapi.json").content)["paths"]
    expected = {
        ("/api/v1/webhooks/", "get"): "webhooks:read",
        ("/api/v1/webhooks/", "post"): "webhooks:write",
        ("/api/v1/webhooks/{subscription_id}", "get"): "webhooks:read",
        ("/api/v1/webhooks/{subscription_id}", "patch"): "webhooks:write",
        ("/api/v1/webhooks/{subscription_id}", "delete"): "webhooks:write",
        ("/api/v1/webhooks/{subscription_id}/secret", "post"): "webhooks:write",
        ("/api/v1/webhooks/deliveries/", "get"): "webhooks:read",
        ("/api/v1/webhooks/deliveries/{message_id}", "get"): "webhooks:read",
        ("/api/v1/webhooks/deliveries/{message_id}/redeliver", "post"): "webhooks:write",
    }
    for (path, method), scope in expected.items():
        operation = paths[path][method]
        assert operation["summary"][0].isupper(), (path, method)
        assert f"Scope: ``{scope}``" in operation["description"], (path, method)
