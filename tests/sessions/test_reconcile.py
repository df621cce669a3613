"""Who may say whether an uncertain irreversible action happened: anyone who may decide
approvals, except the run's launcher and the reviewers who approved that action."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest
from pandaweb.core.roles import Role
from sessions import services
from sessions.models import Run
from tests.factories import ApprovalRequestFactory, user_with_role

pytestmark = pytest.mark.django_db

NOTE = "RCPT-2026-000001 in the portal"


@pytest.fixture
def uncertain() -> ApprovalRequest:
    """An approved action whose end nobody recorded, approved by rory."""
    approval = ApprovalRequestFactory.create()
    rory = user_with_role(Role.REVIEWERS, username="rory")
    ApprovalDecision.objects.create(
        request=approval,
        reviewer=rory,
        verdict=ApprovalDecision.Verdict.APPROVE,
        evidence_sha256=approval.evidence_sha256,
    )
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        status=ApprovalRequest.Status.APPROVED, intent_at=timezone.now()
    )
    Run.objects.filter(pk=approval.run_id).update(status=Run.Status.NEEDS_RECONCILIATION)
    return approval


def reconcile(approval: ApprovalRequest, user: User) -> None:
    services.run_reconcile(run_id=approval.run_id, user=user, happened=True, note=NOTE)


def test_it_refuses_the_reviewer_who_approved_the_action(uncertain: ApprovalRequest) -> None:
    with pytest.raises(services.RunError, match="you approved this action"):
        reconcile(uncertain, User.objects.get(username="rory"))

    assert Run.objects.get(pk=uncertain.run_id).status == Run.Status.NEEDS_RECONCILIATION


def test_it_refuses_the_launcher_even_with_a_reviewers_role(uncertain: ApprovalRequest) -> None:
    launcher = uncertain.run.launched_by
    launcher.groups.add(*user_with_role(Role.REVIEWERS).groups.all())
    # Afresh, as a request loads them: the launching cached their permissions on the object.
    launcher = User.objects.get(pk=launcher.pk)

    with pytest.raises(services.RunError, match="you launched this run"):
        reconcile(uncertain, launcher)


def test_it_refuses_someone_who_may_not_decide_approvals(uncertain: ApprovalRequest) -> None:
    with pytest.raises(services.RunError, match="only someone who may decide approvals"):
        reconcile(uncertain, user_with_role(Role.OPERATORS, username="otto"))

    assert Run.objects.get(pk=uncertain.run_id).status == Run.Status.NEEDS_RECONCILIATION


def test_another_reviewer_settles_it(uncertain: ApprovalRequest) -> None:
    reconcile(uncertain, user_with_role(Role.REVIEWERS, username="vera"))

    assert Run.objects.get(pk=uncertain.run_id).status == Run.Status.SUCCEEDED


def test_the_run_page_offers_the_form_to_other_reviewers_only(
    uncertain: ApprovalRequest, client: Client
) -> None:
    url = f"/runs/{uncertain.run_id}/"
    client.force_login(User.objects.get(username="rory"))
    assert "reconcile-form" not in client.get(url).content.decode()

    client.force_login(user_with_role(Role.REVIEWERS, username="vera"))
    assert "reconcile-form" in client.get(url).content.decode()
