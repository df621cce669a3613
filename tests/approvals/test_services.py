"""Approval policy, quorum, expiry, concurrency and reconciliation, on runs parked at a gate
without a browser (the gate itself, with Chromium, is in test_gate.py)."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import Group, User
from django.db import connections
from django.utils import timezone

from approvals import services as approvals
from approvals.models import ApprovalDecision, ApprovalRequest
from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from sessions import services
from sessions.models import Run
from tests.factories import user_with_role
from tests.patching import patch_destroy_sandbox
from workflows.models import Workflow

INPUTS = {"invoice": "INV-1001", "amount": "1,250.00"}


@pytest.fixture
def destroyed(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    gone: list[dict[str, Any]] = []
    patch_destroy_sandbox(monkeypatch, gone.append)
    return gone


def parked(
    user: User, workflow: Workflow, *, quorum: int = 1, author_may_approve: bool = False
) -> ApprovalRequest:
    """A run waiting at its irreversible step, as the gate leaves it (sandbox record included)."""
    run = services.run_launch(workflow_id=workflow.pk, user=user, raw_inputs=INPUTS)
    now = timezone.now()
    sandbox = {"backend": "local", "run_key": f"run-{run.pk}-x", "host": "h"}
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.AWAITING_APPROVAL, sandbox=sandbox, deadline_at=now + timedelta(minutes=9)
    )
    evidence = {"step_index": 13, "step_id": "submit-payment", "action": "Click it", "filled": []}
    return ApprovalRequest.objects.create(
        run=run,
        step_index=13,
        step_id="submit-payment",
        action="Click it",
        evidence=evidence,
        evidence_sha256=approvals.evidence_hash(evidence),
        quorum=quorum,
        author_may_approve=author_may_approve,
        expires_at=now + timedelta(hours=1),
    )


def decide(approval: ApprovalRequest, user: User, *, approve: bool = True, reason: str = "") -> Any:
    return approvals.approval_decide(
        approval_id=approval.pk,
        user=user,
        approve=approve,
        reason=reason,
        evidence_sha256=approval.evidence_sha256,
    )


@pytest.fixture
def reviewers(db: None) -> list[User]:
    return [user_with_role(Role.REVIEWERS, username=f"reviewer{i}") for i in range(3)]


@pytest.mark.django_db
def test_the_requester_never_approves_their_own_run(
    operator: User, demo_workflow: Workflow, continuations: list[dict[str, Any]]
) -> None:
    operator.groups.add(Group.objects.get(name=Role.REVIEWERS.value))
    approval = parked(operator, demo_workflow)

    with pytest.raises(approvals.ApprovalRefused, match="you launched this run"):
        decide(approval, operator)

    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING
    assert not approval.decisions.exists()
    assert continuations == []


@pytest.mark.django_db
def test_only_the_workflows_reviewer_group_or_admins_decide(
    operator: User, demo_workflow: Workflow, continuations: list[dict[str, Any]]
) -> None:
    approval = parked(operator, demo_workflow)
    another_operator = user_with_role(Role.OPERATORS, username="otto")
    compliance = user_with_role(Role.COMPLIANCE, username="carla")

    for user in (another_operator, compliance):
        with pytest.raises(approvals.ApprovalRefused, match="not allowed to decide"):
            decide(approval, user)
    approval.reviewer_group = "Treasury"
    approval.save()
    with pytest.raises(approvals.ApprovalRefused, match="only members of Treasury"):
        decide(approval, user_with_role(Role.REVIEWERS, username="rory"))

    decide(approval, user_with_role(Role.ADMINS, username="ada"))
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.APPROVED


@pytest.mark.django_db
def test_the_author_approves_only_where_the_workflow_allows_it(
    operator: User, demo_workflow: Workflow, continuations: list[dict[str, Any]]
) -> None:
    launcher = user_with_role(Role.OPERATORS, username="lena")
    operator.groups.add(Group.objects.get(name=Role.REVIEWERS.value))  # the version's author
    # Afresh, as a request loads them: the fixture's object cached its permissions when it
    # published the workflow.
    operator = User.objects.get(pk=operator.pk)
    strict = parked(launcher, demo_workflow)
    with pytest.raises(approvals.ApprovalRefused, match="does not let its author approve"):
        decide(strict, operator)

    lenient = parked(launcher, demo_workflow, author_may_approve=True)
    decide(lenient, operator)
    lenient.refresh_from_db()
    assert lenient.status == ApprovalRequest.Status.APPROVED


@pytest.mark.django_db
def test_quorum_counts_distinct_people_and_one_rejection_rejects(
    operator: User,
    demo_workflow: Workflow,
    reviewers: list[User],
    continuations: list[dict[str, Any]],
    destroyed: list[dict[str, Any]],
) -> None:
    approval = parked(operator, demo_workflow, quorum=2)
    first, second, third = reviewers

    decide(approval, first)
    decide(approval, first)  # a second click by the same person counts once
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING
    assert approval.decisions.count() == 1
    assert continuations == []

    decide(approval, second)
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.APPROVED
    assert approval.run is not None
    assert continuations == [
        {
            "task": "runs.continue",
            "queue": "host.h",
            "run_id": approval.run.pk,
            "approval_id": approval.pk,
        }
    ]
    with pytest.raises(approvals.ApprovalRefused, match="already approved"):
        decide(approval, third, approve=False, reason="too late")

    other = parked(operator, demo_workflow, quorum=2)
    decide(other, first)
    decide(other, second, approve=False, reason="IBAN unknown")
    other.refresh_from_db()
    assert other.run is not None
    other.run.refresh_from_db()
    assert other.status == ApprovalRequest.Status.REJECTED
    assert other.run.status == Run.Status.CANCELLED
    assert other.run.failure_reason == "rejected by reviewer1: IBAN unknown"
    assert len(destroyed) == 1
    assert len(continuations) == 1
    decisions = AuditEvent.objects.filter(action="approval.decided", approval_id=other.pk)
    assert decisions.count() == 2


@pytest.mark.django_db
def test_a_verdict_on_other_evidence_is_refused(
    operator: User, demo_workflow: Workflow, reviewers: list[User]
) -> None:
    approval = parked(operator, demo_workflow)
    with pytest.raises(approvals.ApprovalRefused, match="evidence changed"):
        approvals.approval_decide(
            approval_id=approval.pk, user=reviewers[0], approve=True, evidence_sha256="0" * 64
        )


@pytest.mark.django_db
def test_an_undecided_request_expires_and_cancels_the_run(
    operator: User,
    demo_workflow: Workflow,
    reviewers: list[User],
    continuations: list[dict[str, Any]],
    destroyed: list[dict[str, Any]],
) -> None:
    approval = parked(operator, demo_workflow)
    assert approval.run is not None

    with time_machine.travel(approval.expires_at - timedelta(seconds=1)):
        assert approvals.approval_expire_due() == []
    with time_machine.travel(approval.expires_at + timedelta(seconds=1)):
        with pytest.raises(approvals.ApprovalRefused, match="already expired"):
            # Deciding after the deadline expires it on the spot, and refuses.
            decide(approval, reviewers[0])
        assert approvals.approval_expire_due() == []

    approval.refresh_from_db()
    run = Run.objects.get(pk=approval.run.pk)
    assert approval.status == ApprovalRequest.Status.EXPIRED
    assert run.status == Run.Status.CANCELLED
    assert run.failure_reason == "approval expired"
    assert [d["run_key"] for d in destroyed] == [f"run-{run.pk}-x"]
    assert continuations == []


@pytest.mark.django_db
def test_the_expiry_sweep_cancels_what_nobody_decided(
    operator: User, demo_workflow: Workflow, destroyed: list[dict[str, Any]]
) -> None:
    approval = parked(operator, demo_workflow)
    with time_machine.travel(approval.expires_at + timedelta(minutes=1)):
        assert approvals.approval_expire_due() == [approval.pk]
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.EXPIRED
    assert len(destroyed) == 1
    assert AuditEvent.objects.filter(action="approval.expired", approval_id=approval.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_twenty_reviewers_at_once_make_one_decision_and_one_continuation(
    operator: User, demo_workflow: Workflow, continuations: list[dict[str, Any]]
) -> None:
    approval = parked(operator, demo_workflow)
    people = [user_with_role(Role.REVIEWERS, username=f"crowd{i}") for i in range(20)]
    barrier = threading.Barrier(len(people))
    outcomes: list[str] = []

    def click(user: User) -> None:
        try:
            barrier.wait()
            decide(approval, user)
            outcomes.append("decided")
        except approvals.ApprovalRefused as exc:
            outcomes.append(str(exc))
        finally:
            for conn in connections.all(initialized_only=True):
                conn.close()

    threads = [threading.Thread(target=click, args=(user,)) for user in people]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.APPROVED
    assert ApprovalDecision.objects.filter(request=approval).count() == 1
    assert outcomes.count("decided") == 1
    assert outcomes.count("this request is already approved") == 19
    assert len(continuations) == 1


@pytest.mark.django_db
def test_a_worker_lost_inside_an_approved_action_needs_reconciliation(
    operator: User, demo_workflow: Workflow, reviewers: list[User], destroyed: list[dict[str, Any]]
) -> None:
    approval = parked(operator, demo_workflow)
    assert approval.run is not None
    quiet = timezone.now() - timedelta(minutes=5)
    Run.objects.filter(pk=approval.run.pk).update(status=Run.Status.RUNNING, heartbeat_at=quiet)
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        status=ApprovalRequest.Status.APPROVED, intent_at=quiet
    )

    assert services.run_reap() == [approval.run.pk]

    run = Run.objects.get(pk=approval.run.pk)
    assert run.status == Run.Status.NEEDS_RECONCILIATION
    assert "may have happened" in run.failure_reason
    with pytest.raises(services.TransitionRefused):
        services.run_cancel(run_id=run.pk, user=operator)
    with pytest.raises(services.RunError):
        services.run_reconcile(run_id=run.pk, user=reviewers[0], happened=True, note=" ")

    services.run_reconcile(
        run_id=run.pk, user=reviewers[0], happened=True, note="RCPT-2026-000001 in the portal"
    )

    run.refresh_from_db()
    approval.refresh_from_db()
    assert run.status == Run.Status.FAILED
    assert "confirmed step 14 happened" in run.failure_reason
    assert approval.completed_at is not None
    event = AuditEvent.objects.filter(run_id=run.pk, action="run.failed").get()
    assert event.extra["reconciled"]["note"] == "RCPT-2026-000001 in the portal"


class RecordingLayer:
    """A channel layer that notes each message where the continuation's sending is noted too."""

    def __init__(self, happened: list[str]) -> None:
        self.happened = happened

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        self.happened.append(f"told {group}")


@pytest.mark.django_db
def test_the_continuation_is_sent_before_the_dashboards_are_told(
    operator: User,
    demo_workflow: Workflow,
    reviewers: list[User],
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    approval = parked(operator, demo_workflow)
    happened: list[str] = []
    monkeypatch.setattr(
        "pandaweb.core.dispatch._send",
        lambda task, kwargs, queue: happened.append(f"sent {task.name} to {queue}"),
    )
    layer = RecordingLayer(happened)
    monkeypatch.setattr("sessions.events.get_channel_layer", lambda: layer)
    monkeypatch.setattr("sessions.layer.get_channel_layer", lambda: layer)
    monkeypatch.setattr("approvals.events.get_channel_layer", lambda: layer)

    with django_capture_on_commit_callbacks(execute=True):
        decide(approval, reviewers[0])

    # The reviewer waits for the action; the badge and the run page can follow it.
    assert happened[0] == "sent runs.continue to host.h"
    assert f"told runs.{approval.run_id}" in happened[1:]
    assert "told approvals.pending" in happened[1:]


class BrokenLayer:
    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        raise ConnectionError("the channel layer is down")


@pytest.mark.django_db(transaction=True)
def test_the_runner_acts_once_the_intent_is_committed_even_if_nobody_is_told(
    operator: User, demo_workflow: Workflow, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sessions.services.runstate import TransitionRefused
    from sessions.services.writer import RunSink

    approval = parked(operator, demo_workflow)
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        status=ApprovalRequest.Status.APPROVED, decided_at=timezone.now()
    )
    Run.objects.filter(pk=approval.run_id).update(status=Run.Status.RUNNING)
    monkeypatch.setattr("sessions.events.get_channel_layer", lambda: BrokenLayer())
    monkeypatch.setattr("sessions.layer.get_channel_layer", lambda: BrokenLayer())
    sink = RunSink(approval.run_id)
    sink.approval_id = approval.pk

    sink.action_starting(13)  # returns: the intent is on record, the click may go ahead
    sink.close()

    approval.refresh_from_db()
    assert approval.intent_at is not None
    assert AuditEvent.objects.filter(
        action="approval.action_started", approval_id=approval.pk
    ).exists()
    # A refused intent still stops the runner: only telling the viewers may fail quietly.
    second = RunSink(approval.run_id)
    second.approval_id = approval.pk
    try:
        with pytest.raises(TransitionRefused, match="already started once"):
            second.action_starting(13)
    finally:
        second.close()
