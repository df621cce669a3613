"""Each state change of a run or an approval is one audit event, written by the service that makes
it, in its transaction (workflow services are checked the same way in tests/workflows)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from approvals import services as approvals
from approvals.models import ApprovalRequest
from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from sessions import services
from sessions.models import Run
from tests.factories import user_with_role
from tests.patching import patch_destroy_sandbox, patch_dispatch
from tests.sessions.conftest import acme_credential, demo_workflow, no_background_runs, operator
from workflows.models import Workflow

__all__ = ["acme_credential", "demo_workflow", "no_background_runs", "operator"]

pytestmark = pytest.mark.django_db
INPUTS = {"invoice": "INV-1001", "amount": "1250.00"}


def events_of(call: Callable[[], Any]) -> list[tuple[str, str]]:
    before = AuditEvent.objects.count()
    call()
    return [(e.action, e.object_type) for e in AuditEvent.objects.order_by("sequence")[before:]]


@pytest.fixture(autouse=True)
def no_continuations(monkeypatch: pytest.MonkeyPatch) -> None:
    patch_dispatch(monkeypatch, lambda task, **kwargs: None)
    patch_destroy_sandbox(monkeypatch, lambda data: None)


def waiting(user: User, workflow: Workflow, *, quorum: int = 1) -> ApprovalRequest:
    run = services.run_launch(workflow_id=workflow.pk, user=user, raw_inputs=INPUTS)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.AWAITING_APPROVAL)
    evidence = {"step_index": 13, "step_id": "submit-payment", "filled": []}
    return ApprovalRequest.objects.create(
        run=run, step_index=13, step_id="submit-payment", evidence=evidence, quorum=quorum,
        evidence_sha256=approvals.evidence_hash(evidence),
        expires_at=timezone.now() + timedelta(hours=1),
    )  # fmt: skip


def test_run_services(operator: User, demo_workflow: Workflow) -> None:
    launched: list[Run] = []
    assert events_of(
        lambda: launched.append(
            services.run_launch(workflow_id=demo_workflow.pk, user=operator, raw_inputs=INPUTS)
        )
    ) == [("run.launched", "run")]
    assert events_of(lambda: services.run_cancel(run_id=launched[0].pk, user=operator)) == [
        ("run.cancelled", "run")
    ]
    # Cancelling again changes nothing, and records nothing.
    assert events_of(lambda: services.run_cancel(run_id=launched[0].pk, user=operator)) == []


def test_a_verdict_short_of_quorum_is_one_event(operator: User, demo_workflow: Workflow) -> None:
    approval = waiting(operator, demo_workflow, quorum=2)
    reviewer = user_with_role(Role.REVIEWERS, username="rory")

    def approve() -> None:
        approvals.approval_decide(
            approval_id=approval.pk, user=reviewer, approve=True,
            evidence_sha256=approval.evidence_sha256,
        )  # fmt: skip

    assert events_of(approve) == [("approval.decided", "approval")]
    assert events_of(approve) == []  # a double click


def test_a_decision_that_moves_the_run_is_one_event_per_object(
    operator: User, demo_workflow: Workflow
) -> None:
    approval = waiting(operator, demo_workflow)
    reviewer = user_with_role(Role.REVIEWERS, username="rory")

    def reject() -> None:
        approvals.approval_decide(
            approval_id=approval.pk, user=reviewer, approve=False, reason="no",
            evidence_sha256=approval.evidence_sha256,
        )  # fmt: skip

    events = events_of(reject)

    assert events == [("approval.decided", "approval"), ("run.cancelled", "run")]


def test_expiry_and_reconciliation(operator: User, demo_workflow: Workflow) -> None:
    approval = waiting(operator, demo_workflow)
    ApprovalRequest.objects.filter(pk=approval.pk).update(expires_at=timezone.now())
    assert events_of(approvals.approval_expire_due) == [
        ("run.cancelled", "run"),
        ("approval.expired", "approval"),
    ]

    other = waiting(operator, demo_workflow)
    Run.objects.filter(pk=other.run_id).update(status=Run.Status.NEEDS_RECONCILIATION)
    ApprovalRequest.objects.filter(pk=other.pk).update(
        status=ApprovalRequest.Status.APPROVED, intent_at=timezone.now()
    )
    reviewer = user_with_role(Role.REVIEWERS, username="rory")
    assert events_of(
        lambda: services.run_reconcile(
            run_id=other.run_id, user=reviewer, happened=False, note="no receipt"
        )
    ) == [("run.cancelled", "run")]
