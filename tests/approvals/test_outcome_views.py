"""The decision page and the run page say what outcome an irreversible step waits for, what it
does with a dialog, and what the portal answered."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from approvals.models import ApprovalRequest
from pandaweb.core.roles import Role
from tests.approvals.test_views import client_for, evidence, request_for, waiting_run
from tests.factories import user_with_role
from workflows.models import Workflow

pytestmark = pytest.mark.django_db


@pytest.fixture
def requester(db: None) -> User:
    return user_with_role(Role.OPERATORS, username="olga")


def test_the_decision_and_run_pages_say_what_the_step_expects_and_its_dialog(
    demo_workflow: Workflow,
    requester: User,
    reviewer: User,
) -> None:
    run = waiting_run(demo_workflow, requester)
    approval = request_for(
        run, evidence=evidence(expect="the address matches **/receipts/*", dialog="accept")
    )

    decision = client_for(reviewer).get(f"/approvals/{approval.pk}/").content.decode()
    run_page = client_for(requester).get(f"/runs/{run.pk}/").content.decode()

    assert '<dd id="approval-expect">the address matches **/receipts/*</dd>' in decision
    assert "is accepted (OK); its message is recorded" in decision
    assert (
        '<span id="run-expect">Done only when the address matches **/receipts/*.</span>' in run_page
    )


def test_the_decision_page_says_when_the_portal_refused_the_action(
    demo_workflow: Workflow,
    requester: User,
    reviewer: User,
) -> None:
    approval = request_for(
        waiting_run(demo_workflow, requester),
        status=ApprovalRequest.Status.APPROVED,
        intent_at=timezone.now(),
        refused_at=timezone.now(),
        action_result="the portal refused: This invoice was already approved",
    )

    body = client_for(reviewer).get(f"/approvals/{approval.pk}/").content.decode()

    assert (
        '<dd id="approval-result" class="warn-text">refused the action: the portal refused: '
        "This invoice was already approved</dd>" in body
    )
