from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone
from pytest_django.fixtures import Settings

from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from pandaweb.webhooks import services
from pandaweb.webhooks.models import Attempt, Event, Message, Subscription
from sessions import services as run_services
from sessions.models import Run
from tests.factories import ApprovalRequestFactory, user_with_role
from tests.webhooks.conftest import Receiver
from workflows.models import Workflow

pytestmark = pytest.mark.django_db

INPUTS = {"invoice": "INV-1001", "amount": "1,250.00"}


@pytest.fixture
def admin(db: None) -> User:
    return user_with_role(Role.ADMINS, username="ada")


def subscribe(
    admin: User,
    receiver: Receiver | str,
    *,
    events: list[str] | None = None,
    workflow: Workflow | None = None,
) -> Subscription:
    url = receiver if isinstance(receiver, str) else receiver.url
    subscription, secret = services.subscription_create(
        user=admin,
        name="ERP",
        url=url,
        events=events or [e.value for e in Event],
        workflow_id=workflow.pk if workflow else None,
    )
    if isinstance(receiver, Receiver):
        receiver.secret = secret
    return subscription


def finish(run: Run, status: str = Run.Status.SUCCEEDED, **fields: Any) -> None:
    with transaction.atomic():
        locked = run_services.lock_run(run.pk)
        locked.status = Run.Status.RUNNING
        run_services.transition(locked, status, outputs={"receipt": "R-77"}, **fields)


def launched(operator: User, workflow: Workflow) -> Run:
    return run_services.run_launch(workflow_id=workflow.pk, user=operator, raw_inputs=INPUTS)


def test_a_finished_run_writes_one_outbox_row_per_matching_subscription(
    admin: User, operator: User, demo_workflow: Workflow, receiver: Receiver
) -> None:
    subscribe(admin, receiver)
    subscribe(admin, receiver, events=[Event.RUN_FAILED])
    run = launched(operator, demo_workflow)

    finish(run)

    message = Message.objects.get()
    assert message.event == "run.finished"
    assert message.status == Message.Status.PENDING
    assert message.payload["type"] == "run.finished"
    data = message.payload["data"]
    assert (data["id"], data["status"], data["outputs"]) == (
        run.pk,
        "succeeded",
        {"receipt": "R-77"},
    )
    assert data["links"]["run"].endswith(f"/runs/{run.pk}/")


def test_it_writes_nothing_when_the_change_rolls_back(
    admin: User, operator: User, demo_workflow: Workflow, receiver: Receiver
) -> None:
    subscribe(admin, receiver)
    run = launched(operator, demo_workflow)

    def change_that_fails() -> None:
        with transaction.atomic():
            finish(run)
            raise RuntimeError("the change fails after the transition")

    with pytest.raises(RuntimeError):
        change_that_fails()

    assert not Message.objects.exists()
    assert Run.objects.get(pk=run.pk).status == Run.Status.QUEUED


def test_it_maps_statuses_to_events(
    admin: User, operator: User, demo_workflow: Workflow, receiver: Receiver
) -> None:
    subscribe(admin, receiver)
    failed, reconcile = launched(operator, demo_workflow), launched(operator, demo_workflow)

    finish(failed, Run.Status.FAILED, failure_reason="the portal said no")
    finish(reconcile, Run.Status.NEEDS_RECONCILIATION)

    assert sorted(Message.objects.values_list("event", flat=True)) == [
        "run.failed",
        "run.needs_reconciliation",
    ]
    assert Message.objects.get(event="run.failed").payload["data"]["failure_reason"] == (
        "the portal said no"
    )


def test_a_workflow_subscription_ignores_other_workflows(
    admin: User, operator: User, demo_workflow: Workflow, receiver: Receiver
) -> None:
    from tests.sessions.conftest import publish

    document: dict[str, object] = {
        "name": "Other",
        "slug": "other",
        "settings": {"allowed_hosts": ["127.0.0.1:8001"]},
        "steps": [{"id": "open", "type": "goto", "url": "http://127.0.0.1:8001/"}],
    }
    other = publish(operator, document)
    subscribe(admin, receiver, workflow=other)

    finish(launched(operator, demo_workflow))

    assert not Message.objects.exists()


def test_it_delivers_a_message_the_receiver_verifies(
    admin: User, operator: User, demo_workflow: Workflow, receiver: Receiver
) -> None:
    subscribe(admin, receiver)
    finish(launched(operator, demo_workflow))
    message = Message.objects.get()

    attempt = services.message_deliver(message_id=message.pk)

    assert attempt is not None
    assert attempt.ok
    assert attempt.status_code == 204
    [request] = receiver.received
    assert request["verified"] is True
    assert request["headers"]["webhook-id"] == message.msg_id
    assert request["payload"] == message.payload
    message.refresh_from_db()
    assert message.status == Message.Status.DELIVERED
    assert message.attempts == 1
    assert message.last_status_code == 204


def test_a_receiver_with_another_secret_rejects_the_signature(
    admin: User, operator: User, demo_workflow: Workflow, receiver: Receiver
) -> None:
    subscribe(admin, receiver)
    receiver.secret = services.secret_generate()
    finish(launched(operator, demo_workflow))

    services.message_deliver(message_id=Message.objects.get().pk)

    assert [r["verified"] for r in receiver.received] == [False]


def test_it_retries_with_growing_waits_when_the_receiver_answers_500(
    admin: User, operator: User, demo_workflow: Workflow, receiver: Receiver
) -> None:
    receiver.answer = 500
    subscribe(admin, receiver)
    finish(launched(operator, demo_workflow))
    message = Message.objects.get()

    with time_machine.travel(timezone.now(), tick=False) as clock:
        services.message_deliver(message_id=message.pk)
        message.refresh_from_db()
        first_wait = message.next_attempt_at - timezone.now()
        assert services.messages_drain() == 0  # not due yet
        clock.shift(first_wait)
        assert services.messages_drain() == 1
        message.refresh_from_db()
        second_wait = message.next_attempt_at - timezone.now()

    assert message.status == Message.Status.PENDING
    assert message.attempts == 2
    assert message.last_status_code == 500
    assert second_wait > first_wait > timedelta(0)
    assert list(Attempt.objects.values_list("status_code", flat=True)) == [500, 500]


def test_it_survives_a_receiver_that_is_down(
    admin: User, operator: User, demo_workflow: Workflow, closed_port_url: str
) -> None:
    subscribe(admin, closed_port_url)
    finish(launched(operator, demo_workflow))
    message = Message.objects.get()

    attempt = services.message_deliver(message_id=message.pk)

    assert attempt is not None
    assert not attempt.ok
    assert attempt.status_code is None
    assert attempt.error == "could not connect to the receiver"
    message.refresh_from_db()
    assert message.status == Message.Status.PENDING
    assert message.attempts == 1


def test_it_gives_up_waiting_for_a_slow_receiver(
    admin: User,
    operator: User,
    demo_workflow: Workflow,
    receiver: Receiver,
    settings: Settings,
) -> None:
    settings.WEBHOOK_TIMEOUT_SECONDS = 1
    receiver.hold = threading.Event()
    subscribe(admin, receiver)
    finish(launched(operator, demo_workflow))

    attempt = services.message_deliver(message_id=Message.objects.get().pk)

    assert attempt is not None
    assert attempt.status_code is None
    assert attempt.error == "no answer within 1 s"
    assert attempt.duration_ms >= 1000


def test_it_gives_a_message_up_after_the_last_attempt(
    admin: User,
    operator: User,
    demo_workflow: Workflow,
    receiver: Receiver,
    settings: Settings,
) -> None:
    settings.WEBHOOK_MAX_ATTEMPTS = 2
    receiver.answer = 503
    subscribe(admin, receiver)
    finish(launched(operator, demo_workflow))
    message = Message.objects.get()

    services.message_deliver(message_id=message.pk, manual=True)
    services.message_deliver(message_id=message.pk, manual=True)

    message.refresh_from_db()
    assert message.status == Message.Status.FAILED
    assert services.message_deliver(message_id=message.pk, manual=True) is None
    assert len(receiver.received) == 2


def test_it_switches_a_subscription_off_after_repeated_failures(
    admin: User,
    operator: User,
    demo_workflow: Workflow,
    closed_port_url: str,
    settings: Settings,
) -> None:
    settings.WEBHOOK_DISABLE_AFTER = 3
    subscription = subscribe(admin, closed_port_url)
    for _ in range(3):
        finish(launched(operator, demo_workflow))

    for message in Message.objects.all():
        services.message_deliver(message_id=message.pk)

    subscription.refresh_from_db()
    assert subscription.active is False
    assert "3 failed attempts in a row" in subscription.disabled_reason
    event = AuditEvent.objects.get(action="webhook.subscription_disabled")
    assert event.actor is None
    assert event.object_id == str(subscription.pk)
    # A switched-off subscription gets no new messages and its pending ones wait.
    finish(launched(operator, demo_workflow))
    assert Message.objects.count() == 3
    assert services.messages_drain() == 0


def test_redelivery_by_hand_sends_the_same_message_again(
    admin: User, operator: User, demo_workflow: Workflow, receiver: Receiver
) -> None:
    subscribe(admin, receiver)
    finish(launched(operator, demo_workflow))
    message = Message.objects.get()
    services.message_deliver(message_id=message.pk)

    services.message_redeliver(message_id=message.pk, user=admin)
    services.message_deliver(message_id=message.pk, manual=True)

    assert [r["headers"]["webhook-id"] for r in receiver.received] == [message.msg_id] * 2
    assert [a.manual for a in Attempt.objects.order_by("pk")] == [False, True]
    assert AuditEvent.objects.filter(action="webhook.redelivered", actor=admin).count() == 1


def test_two_workers_never_deliver_one_message_at_once(
    admin: User, operator: User, demo_workflow: Workflow, receiver: Receiver
) -> None:
    subscribe(admin, receiver)
    finish(launched(operator, demo_workflow))
    message = Message.objects.get()

    assert services._claim(message.pk, manual=False) is True
    assert services.message_deliver(message_id=message.pk) is None
    assert services.messages_drain() == 0
    assert receiver.received == []


def test_approval_events_carry_the_decision_and_no_evidence(
    admin: User, receiver: Receiver
) -> None:
    subscribe(admin, receiver, events=[Event.APPROVAL_DECIDED])
    approval = ApprovalRequestFactory.create(evidence={"typed": "DE97 …"})
    reviewer = user_with_role(Role.REVIEWERS, username="rory")

    approval_decide(
        approval_id=approval.pk,
        user=reviewer,
        approve=False,
        reason="wrong amount",
        evidence_sha256=approval.evidence_sha256,
    )

    message = Message.objects.get()
    data = message.payload["data"]
    assert message.event == "approval.decided"
    assert data["status"] == ApprovalRequest.Status.REJECTED
    assert data["decisions"] == [
        {"reviewer": "rory", "verdict": "reject", "reason": "wrong amount"}
    ]
    assert "evidence" not in data
    assert "DE97" not in str(message.payload)


def test_subscription_changes_are_audited_and_the_secret_is_never_stored_plain(
    admin: User, receiver: Receiver
) -> None:
    subscription = subscribe(admin, receiver)

    services.subscription_update(
        subscription_id=subscription.pk,
        user=admin,
        name="ERP",
        url=receiver.url + "/v2",
        events=["run.finished"],
        workflow_id=None,
    )
    services.subscription_set_active(subscription_id=subscription.pk, user=admin, active=False)

    subscription.refresh_from_db()
    assert receiver.secret.startswith("whsec_")
    assert receiver.secret not in subscription.secret_sealed
    assert services.subscription_secret(subscription) == receiver.secret
    assert list(
        AuditEvent.objects.filter(object_type="webhook_subscription").values_list(
            "action", flat=True
        )
    ) == [
        "webhook.subscription_created",
        "webhook.subscription_updated",
        "webhook.subscription_disabled",
    ]
    assert receiver.secret not in str(list(AuditEvent.objects.values_list("after", flat=True)))


def test_it_refuses_an_address_that_is_not_http(admin: User) -> None:
    with pytest.raises(services.WebhookError) as refused:
        services.subscription_create(
            user=admin,
            name="x",
            url="file:///etc/passwd",
            events=["run.finished"],
            workflow_id=None,
        )

    assert "url" in refused.value.field_errors
    assert not Subscription.objects.exists()


def test_a_pending_approval_announces_itself_with_links(admin: User, receiver: Receiver) -> None:
    subscribe(admin, receiver, events=[Event.APPROVAL_REQUESTED])
    approval = ApprovalRequestFactory.create()

    with transaction.atomic():
        services.outbox_record_approval(approval=approval)

    data = Message.objects.get(event="approval.requested").payload["data"]
    assert (data["id"], data["status"], data["run"]["id"]) == (
        approval.pk,
        "pending",
        approval.run_id,
    )
    assert data["links"]["approval"].endswith(f"/approvals/{approval.pk}/")


@pytest.mark.django_db(transaction=True)
def test_it_refuses_to_record_outside_the_transaction_of_the_change(
    admin: User, receiver: Receiver
) -> None:
    subscribe(admin, receiver)
    approval = ApprovalRequestFactory.create()

    with pytest.raises(RuntimeError):
        services.outbox_record(event=Event.APPROVAL_REQUESTED, approval=approval)

    assert not Message.objects.exists()


def test_beat_and_the_housekeeping_thread_know_the_periodic_tasks() -> None:
    from django.conf import settings

    from pandaweb.celery import app

    app.loader.import_default_modules()
    beat = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {"webhooks.drain", "schedules.tick"} <= beat
    assert {"webhooks.drain", "schedules.tick"} <= set(app.tasks)


def opened_request() -> ApprovalRequest:
    """A running run reaching its gate as the runner does: the request opens, the run waits."""
    from approvals.services import approval_open
    from sessions.engine.plan import Gate
    from tests.approvals.reach import png

    run = ApprovalRequestFactory.create().run
    run.approvals.all().delete()
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    evidence = {"step_index": 0, "step_id": "pay", "action": "Click the button 'Pay'", "target": {}}
    with transaction.atomic():
        locked = run_services.lock_run(run.pk)
        approval = approval_open(run=locked, gate=Gate.of(evidence, png()), previous=None)
        run_services.transition(locked, Run.Status.AWAITING_APPROVAL, reason="irreversible step")
    return approval


def test_a_new_request_is_announced_with_its_run_waiting(admin: User, receiver: Receiver) -> None:
    subscribe(admin, receiver, events=[Event.APPROVAL_REQUESTED])

    approval = opened_request()

    data = Message.objects.get(event="approval.requested").payload["data"]
    assert (data["id"], data["status"]) == (approval.pk, "pending")
    assert data["run"]["status"] == Run.Status.AWAITING_APPROVAL


@pytest.mark.parametrize(
    ("approve", "approval_status", "run_status"),
    [
        (True, ApprovalRequest.Status.APPROVED, Run.Status.RUNNING),
        (False, ApprovalRequest.Status.REJECTED, Run.Status.CANCELLED),
    ],
)
def test_a_verdict_is_announced_with_the_run_status_it_caused(
    admin: User, receiver: Receiver, approve: bool, approval_status: str, run_status: str
) -> None:
    subscribe(admin, receiver)
    approval = opened_request()
    reviewer = user_with_role(Role.REVIEWERS, username="rory")

    approval_decide(
        approval_id=approval.pk,
        user=reviewer,
        approve=approve,
        reason="checked" if approve else "wrong amount",
        evidence_sha256=approval.evidence_sha256,
    )

    data = Message.objects.get(event="approval.decided").payload["data"]
    assert (data["status"], data["run"]["status"]) == (approval_status, run_status)
    assert [m.payload["data"]["status"] for m in Message.objects.filter(event="run.failed")] == (
        [] if approve else [Run.Status.CANCELLED]
    )


def test_an_expired_request_is_announced_with_its_run_cancelled(
    admin: User, receiver: Receiver
) -> None:
    from approvals.services import approval_expire_due

    subscribe(admin, receiver, events=[Event.APPROVAL_DECIDED])
    approval = opened_request()

    with time_machine.travel(approval.expires_at + timedelta(seconds=1)):
        assert approval_expire_due() == [approval.pk]

    data = Message.objects.get(event="approval.decided").payload["data"]
    assert (data["status"], data["run"]["status"]) == (
        ApprovalRequest.Status.EXPIRED,
        Run.Status.CANCELLED,
    )


def test_the_services_answer_someone_who_may_not_manage_its_subscriptions_as_for_a_missing_one(
    admin: User, operator: User, closed_port_url: str
) -> None:
    subscription = subscribe(admin, closed_port_url)
    message = Message.objects.create(
        subscription=subscription, msg_id="msg_1", event="run.finished", payload={},
        status=Message.Status.FAILED, next_attempt_at=timezone.now(),
    )  # fmt: skip
    events = AuditEvent.objects.count()

    changes = [
        lambda: services.subscription_update(
            subscription_id=subscription.pk,
            user=operator,
            name="Mine",
            url=closed_port_url,
            events=["run.finished"],
            workflow_id=None,
        ),
        lambda: services.subscription_set_active(
            subscription_id=subscription.pk, user=operator, active=False
        ),
        lambda: services.subscription_rotate_secret(subscription_id=subscription.pk, user=operator),
        lambda: services.subscription_delete(subscription_id=subscription.pk, user=operator),
    ]
    for change in changes:
        with pytest.raises(Subscription.DoesNotExist):
            change()
    with pytest.raises(Message.DoesNotExist):
        services.message_redeliver(message_id=message.pk, user=operator)

    subscription.refresh_from_db()
    message.refresh_from_db()
    assert (subscription.name, subscription.active) == ("ERP", True)
    assert message.status == Message.Status.FAILED
    assert AuditEvent.objects.count() == events
