"""Reminders, escalation, hand-over, comments and out-of-office, on runs parked at a gate
without a browser. Housekeeping is run twice where it matters: each message goes once."""

from __future__ import annotations

import io
import threading
from collections import Counter
from collections.abc import Callable
from datetime import date, timedelta
from typing import Any

import pytest
import time_machine
import yaml
from django.contrib.auth.models import Group, Permission, User
from django.core import mail
from django.db import connections
from django.utils import timezone
from PIL import Image
from pydantic import ValidationError

from approvals import services as approvals
from approvals.models import ApprovalComment, ApprovalDecision, ApprovalRequest, ReviewerAbsence
from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Capability, Role
from sessions.engine.plan import Gate
from sessions.tasks import runs_reap_task
from tests.approvals.test_services import decide, parked
from tests.factories import user_with_role
from tests.sessions.conftest import EXAMPLE, publish
from workflows.models import Workflow
from workflows.schema import ApprovalPolicy

pytestmark = pytest.mark.django_db

Captured = Callable[..., Any]


@pytest.fixture
def reviewers(db: None) -> list[User]:
    return [
        user_with_role(Role.REVIEWERS, username=f"reviewer{i}", email=f"reviewer{i}@example.test")
        for i in range(2)
    ]


@pytest.fixture
def treasurer(db: None) -> User:
    """A member of the escalation group, which may decide approvals but is not the workflow's."""
    group = Group.objects.create(name="Treasury")
    group.permissions.add(
        *Permission.objects.filter(
            content_type__app_label="core",
            codename__in=[Capability.DECIDE_APPROVALS.value, Capability.VIEW_APPROVALS.value],
        )
    )
    user = user_with_role(None, username="tess", email="tess@example.test")
    user.groups.add(group)
    return user


@pytest.fixture
def stranger(db: None) -> User:
    return user_with_role(Role.OPERATORS, username="sam", email="sam@example.test")


def with_policy(approval: ApprovalRequest, **fields: Any) -> ApprovalRequest:
    ApprovalRequest.objects.filter(pk=approval.pk).update(**fields)
    approval.refresh_from_db()
    return approval


def events(approval: ApprovalRequest, action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action, approval_id=approval.pk))


def housekeeping_twice(capture: Captured) -> list[dict[str, list[int]]]:
    passes = []
    for _ in range(2):
        with capture(execute=True):
            passes.append(approvals.approval_housekeeping())
    return passes


def test_it_reminds_the_reviewers_once_before_expiry(
    operator: User,
    demo_workflow: Workflow,
    reviewers: list[User],
    django_capture_on_commit_callbacks: Captured,
) -> None:
    approval = with_policy(parked(operator, demo_workflow), remind_before_minutes=10)

    with time_machine.travel(approval.expires_at - timedelta(minutes=11)):
        assert housekeeping_twice(django_capture_on_commit_callbacks)[0]["reminded"] == []
    assert mail.outbox == []

    with time_machine.travel(approval.expires_at - timedelta(minutes=9)):
        first, second = housekeeping_twice(django_capture_on_commit_callbacks)
    assert first["reminded"] == [approval.pk]
    assert second["reminded"] == []
    approval.refresh_from_db()
    assert approval.reminded_at is not None
    assert approval.status == ApprovalRequest.Status.PENDING
    assert len(events(approval, "approval.reminded")) == 1
    # One message per person (each through their own channels: pandaweb.reviewers.notify).
    assert all(m.subject.startswith("Reminder: approval expires in 9 min") for m in mail.outbox)
    assert sorted(m.to[0] for m in mail.outbox) == [
        "reviewer0@example.test",
        "reviewer1@example.test",
    ]


def test_the_reminder_skips_who_already_decided_and_who_is_away(
    operator: User,
    demo_workflow: Workflow,
    reviewers: list[User],
    django_capture_on_commit_callbacks: Captured,
) -> None:
    approval = with_policy(parked(operator, demo_workflow, quorum=2), remind_before_minutes=10)
    third = user_with_role(Role.REVIEWERS, username="reviewer2", email="reviewer2@example.test")
    decide(approval, reviewers[0])
    today = timezone.localdate()
    ReviewerAbsence.objects.create(
        user=reviewers[1], away_from=today - timedelta(days=1), away_until=today + timedelta(days=1)
    )

    with (
        time_machine.travel(approval.expires_at - timedelta(minutes=5)),
        django_capture_on_commit_callbacks(execute=True),
    ):
        assert approvals.approval_remind_due() == [approval.pk]

    assert [m.to for m in mail.outbox] == [[third.email]]
    # Away means not told, never not allowed: the absent reviewer still decides.
    decide(approval, reviewers[1])
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.APPROVED


def test_it_escalates_once_and_the_escalation_group_may_decide(
    operator: User,
    demo_workflow: Workflow,
    reviewers: list[User],
    treasurer: User,
    continuations: list[dict[str, Any]],
    django_capture_on_commit_callbacks: Captured,
) -> None:
    approval = with_policy(
        parked(operator, demo_workflow), escalate_after_minutes=20, escalation_group="Treasury"
    )
    with pytest.raises(approvals.ApprovalRefused, match="only members of Reviewers decide"):
        decide(approval, treasurer)

    with time_machine.travel(approval.created_at + timedelta(minutes=19)):
        assert housekeeping_twice(django_capture_on_commit_callbacks)[0]["escalated"] == []
    with time_machine.travel(approval.created_at + timedelta(minutes=21)):
        first, second = housekeeping_twice(django_capture_on_commit_callbacks)
    assert (first["escalated"], second["escalated"]) == ([approval.pk], [])
    assert [m.to for m in mail.outbox] == [[treasurer.email]]
    [escalated] = events(approval, "approval.escalated")
    assert escalated.after == {"group": "Treasury", "after_minutes": 20}

    decide(approval, treasurer)
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.APPROVED
    assert approval.escalated_at is not None
    assert approval.decisions.get().reviewer == treasurer


def test_the_reap_task_sends_reminders_and_escalations_exactly_once(
    operator: User,
    demo_workflow: Workflow,
    reviewers: list[User],
    treasurer: User,
    django_capture_on_commit_callbacks: Captured,
) -> None:
    approval = with_policy(
        parked(operator, demo_workflow),
        remind_before_minutes=30,
        escalate_after_minutes=30,
        escalation_group="Treasury",
    )
    with time_machine.travel(approval.created_at + timedelta(minutes=45)):
        for _ in range(2):
            with django_capture_on_commit_callbacks(execute=True):
                runs_reap_task()
    assert len(events(approval, "approval.escalated")) == 1
    assert len(events(approval, "approval.reminded")) == 1
    # Escalated first, so the reminder reaches the escalation group too.
    assert [m.to for m in mail.outbox[:1]] == [[treasurer.email]]
    assert sorted(m.to[0] for m in mail.outbox[1:]) == sorted(
        [r.email for r in reviewers] + [treasurer.email]
    )


def test_nothing_is_sent_for_a_request_that_is_no_longer_pending(
    operator: User,
    demo_workflow: Workflow,
    reviewers: list[User],
    continuations: list[dict[str, Any]],
    django_capture_on_commit_callbacks: Captured,
) -> None:
    approval = with_policy(
        parked(operator, demo_workflow), remind_before_minutes=50, escalation_group="Treasury"
    )
    decide(approval, reviewers[0])
    with time_machine.travel(approval.expires_at - timedelta(minutes=5)):
        assert housekeeping_twice(django_capture_on_commit_callbacks)[0]["reminded"] == []
    approval.refresh_from_db()
    assert approval.reminded_at is None
    assert mail.outbox == []


def test_it_hands_a_request_to_a_reviewer_who_may_decide_it(
    operator: User,
    demo_workflow: Workflow,
    reviewers: list[User],
    django_capture_on_commit_callbacks: Captured,
) -> None:
    approval = parked(operator, demo_workflow)
    with django_capture_on_commit_callbacks(execute=True):
        approvals.approval_reassign(
            approval_id=approval.pk, user=reviewers[0], assignee=reviewers[1], note="I wrote it"
        )
    approval.refresh_from_db()
    assert approval.assignee == reviewers[1]
    [event] = events(approval, "approval.reassigned")
    assert event.actor_id == reviewers[0].pk
    assert event.before == {"assignee": None, "group": "Reviewers"}
    assert event.after == {"assignee": "reviewer1", "group": "Reviewers", "note": "I wrote it"}
    assert [m.to for m in mail.outbox] == [[reviewers[1].email]]
    assert "reviewer0 handed this request to reviewer1: I wrote it" in mail.outbox[0].body


def test_it_refuses_to_hand_over_to_someone_the_policy_does_not_allow(
    operator: User, demo_workflow: Workflow, reviewers: list[User], stranger: User
) -> None:
    approval = parked(operator, demo_workflow)
    with pytest.raises(approvals.ApprovalRefused, match="sam cannot decide this request"):
        approvals.approval_reassign(approval_id=approval.pk, user=reviewers[0], assignee=stranger)
    with pytest.raises(approvals.ApprovalRefused, match="olivia cannot decide"):
        # The launcher is never a way round the four-eyes rule.
        approvals.approval_reassign(approval_id=approval.pk, user=reviewers[0], assignee=operator)
    with pytest.raises(approvals.ApprovalRefused, match="not allowed to decide approvals"):
        approvals.approval_reassign(approval_id=approval.pk, user=stranger, assignee=reviewers[1])
    with pytest.raises(approvals.ApprovalRefused, match="Operators is not a group whose members"):
        approvals.approval_reassign(approval_id=approval.pk, user=reviewers[0], group="Operators")
    approval.refresh_from_db()
    assert approval.assignee is None
    assert approval.reviewer_group == "Reviewers"
    assert events(approval, "approval.reassigned") == []


def test_a_request_handed_to_a_group_is_decided_by_that_group(
    operator: User,
    demo_workflow: Workflow,
    reviewers: list[User],
    treasurer: User,
    continuations: list[dict[str, Any]],
) -> None:
    approval = parked(operator, demo_workflow)
    approvals.approval_reassign(approval_id=approval.pk, user=reviewers[0], group="Treasury")
    approval.refresh_from_db()
    assert approval.reviewer_group == "Treasury"
    with pytest.raises(approvals.ApprovalRefused, match="only members of Treasury decide"):
        decide(approval, reviewers[1])
    decide(approval, treasurer)
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.APPROVED


def test_a_comment_is_recorded_and_audited_but_is_not_a_decision(
    operator: User, demo_workflow: Workflow, reviewers: list[User], stranger: User
) -> None:
    approval = parked(operator, demo_workflow)
    comment = approvals.approval_comment(
        approval_id=approval.pk, user=reviewers[0], body="  The IBAN matches the contract.  "
    )
    # The launcher may follow and discuss their own run's request, never decide it.
    approvals.approval_comment(approval_id=approval.pk, user=operator, body="Due today")
    with pytest.raises(approvals.ApprovalRefused, match="not allowed to see"):
        approvals.approval_comment(approval_id=approval.pk, user=stranger, body="hi")
    with pytest.raises(approvals.ApprovalRefused, match="needs some text"):
        approvals.approval_comment(approval_id=approval.pk, user=reviewers[0], body="   ")

    assert comment.body == "The IBAN matches the contract."
    assert list(ApprovalComment.objects.values_list("author__username", flat=True)) == [
        "reviewer0",
        "olivia",
    ]
    assert ApprovalDecision.objects.count() == 0
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING
    assert [(e.after or {}).get("body") for e in events(approval, "approval.commented")] == [
        "The IBAN matches the contract.",
        "Due today",
    ]


def test_an_out_of_office_is_set_cleared_and_audited(reviewers: list[User]) -> None:
    user = reviewers[0]
    approvals.reviewer_absence_set(
        user=user, away_from=date(2026, 12, 20), away_until=date(2026, 12, 31)
    )
    approvals.reviewer_absence_set(
        user=user, away_from=date(2026, 12, 20), away_until=date(2026, 12, 31)
    )
    with pytest.raises(approvals.ApprovalRefused, match="comes before"):
        approvals.reviewer_absence_set(
            user=user, away_from=date(2026, 12, 20), away_until=date(2026, 12, 1)
        )
    assert ReviewerAbsence.objects.get(user=user).away_until == date(2026, 12, 31)
    approvals.reviewer_absence_set(user=user, away_from=None, away_until=None)
    assert not ReviewerAbsence.objects.filter(user=user).exists()
    changes = AuditEvent.objects.filter(action="reviewer.absence_set", object_id=str(user.pk))
    assert [(e.before, e.after) for e in changes.order_by("pk")] == [
        (None, {"from": "2026-12-20", "until": "2026-12-31"}),
        ({"from": "2026-12-20", "until": "2026-12-31"}, None),
    ]


def test_the_policy_refuses_an_escalation_without_a_group_or_after_expiry() -> None:
    assert ApprovalPolicy().remind_before_minutes == 0
    assert ApprovalPolicy().escalation_group == ""
    with pytest.raises(ValidationError, match="needs an escalation_group"):
        ApprovalPolicy(escalate_after_minutes=10)
    with pytest.raises(ValidationError, match="shorter than expiry_minutes"):
        ApprovalPolicy(expiry_minutes=30, escalate_after_minutes=30, escalation_group="Treasury")
    with pytest.raises(ValidationError, match="shorter than expiry_minutes"):
        ApprovalPolicy(expiry_minutes=30, remind_before_minutes=45)


def test_a_request_freezes_the_reminder_and_escalation_of_its_version(
    operator: User,
    acme_credential: Any,
    settings: Any,
    tmp_path: Any,
    django_capture_on_commit_callbacks: Captured,
) -> None:
    settings.RUN_FILES_DIR = tmp_path
    document = yaml.safe_load(EXAMPLE.read_text())
    document.setdefault("settings", {})["approval"] = {
        "remind_before_minutes": 5,
        "escalate_after_minutes": 15,
        "escalation_group": "Treasury",
    }
    run = parked(operator, publish(operator, document)).run
    assert run is not None
    picture = io.BytesIO()
    Image.new("RGB", (800, 600), "white").save(picture, format="PNG")
    gate = Gate.of(
        {"step_index": 2, "step_id": "pay", "action": "Click it", "target": {}}, picture.getvalue()
    )
    with django_capture_on_commit_callbacks(execute=True):
        approval = approvals.approval_open(run=run, gate=gate, previous=None)
    approval.refresh_from_db()
    assert (
        approval.remind_before_minutes,
        approval.escalate_after_minutes,
        approval.escalation_group,
    ) == (5, 15, "Treasury")
    assert (approval.reminded_at, approval.escalated_at) == (None, None)


@pytest.mark.django_db(transaction=True)
def test_two_housekeeping_passes_at_once_send_each_message_once(
    operator: User, demo_workflow: Workflow, reviewers: list[User], treasurer: User
) -> None:
    approval = with_policy(
        parked(operator, demo_workflow),
        remind_before_minutes=30,
        escalate_after_minutes=30,
        escalation_group="Treasury",
    )
    barrier = threading.Barrier(2)
    results: list[dict[str, list[int]]] = []

    def sweep() -> None:
        try:
            barrier.wait()
            results.append(approvals.approval_housekeeping())
        finally:
            for conn in connections.all(initialized_only=True):
                conn.close()

    with time_machine.travel(approval.created_at + timedelta(minutes=45)):
        threads = [threading.Thread(target=sweep) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)

    assert sorted(len(r["reminded"]) for r in results) == [0, 1]
    assert sorted(len(r["escalated"]) for r in results) == [0, 1]
    assert len(events(approval, "approval.reminded")) == 1
    assert len(events(approval, "approval.escalated")) == 1
    # One escalation (to the treasurer) and one reminder (reviewers and the treasurer), each
    # message once per person.
    sent = Counter(m.subject.split(":")[0] for m in mail.outbox)
    assert sent == {"Approval escalated to Treasury": 1, "Reminder": 3}
