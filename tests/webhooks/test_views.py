from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client

from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from pandaweb.webhooks import services
from pandaweb.webhooks.models import Message, Subscription
from sessions import services as run_services
from sessions.models import Run
from tests.factories import team_make, user_with_role
from workflows.models import Workflow

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(db: None) -> User:
    return user_with_role(Role.ADMINS, username="ada")


@pytest.fixture
def subscription(admin: User) -> Subscription:
    subscription, _ = services.subscription_create(
        user=admin, name="ERP", url="http://127.0.0.1:9/hooks", events=["run.finished"],
        workflow_id=None,
    )  # fmt: skip
    return subscription


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_an_admin_switches_a_subscription_off_and_on(
    admin: User, subscription: Subscription
) -> None:
    client = signed_in(admin)

    client.post(f"/webhooks/{subscription.pk}/active/", {"active": "0"})
    subscription.refresh_from_db()
    assert subscription.active is False
    client.post(f"/webhooks/{subscription.pk}/active/", {"active": "1"})

    subscription.refresh_from_db()
    assert subscription.active is True
    assert list(
        AuditEvent.objects.filter(
            actor=admin, action__startswith="webhook.subscription_e"
        ).values_list("action", flat=True)
    ) == ["webhook.subscription_enabled"]


def test_renewing_the_secret_shows_the_new_one_once(
    admin: User, subscription: Subscription
) -> None:
    client = signed_in(admin)
    before = services.subscription_secret(subscription)

    body = client.post(f"/webhooks/{subscription.pk}/secret/").content.decode()

    subscription.refresh_from_db()
    after = services.subscription_secret(subscription)
    assert after != before
    assert after in body
    assert after not in client.get(f"/webhooks/{subscription.pk}/").content.decode()


def test_the_delivery_log_and_redelivery_by_hand(
    admin: User, subscription: Subscription, operator: User, demo_workflow: Workflow
) -> None:
    run = run_services.run_launch(
        workflow_id=demo_workflow.pk,
        user=operator,
        raw_inputs={"invoice": "INV-1001", "amount": "1"},
    )
    with transaction.atomic():
        locked = run_services.lock_run(run.pk)
        locked.status = Run.Status.RUNNING
        run_services.transition(locked, Run.Status.SUCCEEDED)
    message = Message.objects.get()
    Message.objects.filter(pk=message.pk).update(status=Message.Status.FAILED)
    client = signed_in(admin)

    log = client.get("/webhooks/deliveries/?status=failed").content.decode()
    client.post(f"/webhooks/deliveries/{message.pk}/redeliver/")

    assert f"/webhooks/deliveries/{message.pk}/" in log
    message.refresh_from_db()
    assert message.status == Message.Status.PENDING
    assert AuditEvent.objects.filter(action="webhook.redelivered", actor=admin).exists()


def test_operators_and_reviewers_are_refused(subscription: Subscription) -> None:
    for role in (Role.OPERATORS, Role.REVIEWERS, Role.COMPLIANCE):
        client = signed_in(user_with_role(role))
        assert client.get("/webhooks/").status_code == 403
        assert (
            client.post(f"/webhooks/{subscription.pk}/active/", {"active": "0"}).status_code == 403
        )
    subscription.refresh_from_db()
    assert subscription.active is True


def test_the_list_names_each_subscriptions_team_once_there_are_several(
    admin: User, subscription: Subscription
) -> None:
    alone = signed_in(admin).get("/webhooks/").content.decode()
    team_make("procurement")
    several = signed_in(admin).get("/webhooks/").content.decode()

    assert "<th>Team</th>" not in alone
    assert "<th>Team</th>" in several
    assert f"<td>{subscription.team.name}</td>" in several
