"""Approvals and questions per team: a reviewer decides, sees and is told of their teams' runs
only; the quorum counts the verdicts of people still allowed in the run's team."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.http import Http404
from django.test import Client
from django.utils import timezone

from approvals import questions, selectors, services, slack_callbacks
from approvals.models import ApprovalRequest, Question
from approvals.policy import approval_refusal
from pandaweb.core.models import Membership, Team
from pandaweb.core.roles import Role
from sessions.models import Run
from tests.approvals.test_views import evidence as sample_evidence
from tests.factories import member_of, user_with_role, waiting_run

pytestmark = pytest.mark.django_db


def gated(team: Team, *, quorum: int = 1, reviewer_group: str = "Reviewers") -> ApprovalRequest:
    """A request of a run of ``team`` waiting at its gate (with a sandbox to continue on)."""
    run = waiting_run()
    Run.objects.filter(pk=run.pk).update(team=team, sandbox={"backend": "local", "host": "h"})
    run.refresh_from_db()
    evidence = sample_evidence()
    return ApprovalRequest.objects.create(
        run=run,
        step_index=0,
        step_id="pay",
        action="Click it",
        evidence=evidence,
        evidence_sha256=services.evidence_hash(evidence),
        quorum=quorum,
        reviewer_group=reviewer_group,
        expires_at=timezone.now() + timedelta(hours=1),
    )


def decide(approval: ApprovalRequest, user: User) -> ApprovalRequest:
    return services.approval_decide(
        approval_id=approval.pk,
        user=user,
        approve=True,
        evidence_sha256=approval.evidence_sha256,
    )


def test_only_reviewers_of_the_runs_team_and_admins_decide(
    payables: Team, procurement: Team, continuations: list[dict[str, Any]]
) -> None:
    approval = gated(payables, quorum=3)
    ours = member_of(payables, Role.REVIEWERS)
    stranger = member_of(procurement, Role.REVIEWERS)
    admin = user_with_role(Role.ADMINS)

    decide(approval, ours)
    with pytest.raises(services.ApprovalRefused, match="another team's runs"):
        decide(approval, stranger)
    decide(approval, admin)

    deciders = set(approval.decisions.values_list("reviewer__username", flat=True))
    assert deciders == {ours.username, admin.username}


def test_the_quorum_counts_only_people_still_allowed_in_the_team(
    payables: Team, continuations: list[dict[str, Any]]
) -> None:
    approval = gated(payables, quorum=2)
    leaver, stayer, admin = (
        member_of(payables, Role.REVIEWERS),
        member_of(payables, Role.REVIEWERS),
        user_with_role(Role.ADMINS),
    )
    decide(approval, leaver)
    Membership.objects.filter(user=leaver).delete()

    decide(approval, stayer)
    approval.refresh_from_db()
    assert (
        approval.status == ApprovalRequest.Status.PENDING
    )  # the leaver's verdict no longer counts
    assert continuations == []

    decide(approval, admin)
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.APPROVED
    assert [c["approval_id"] for c in continuations] == [approval.pk]


def test_a_custom_reviewer_group_also_needs_the_runs_team(
    payables: Team, procurement: Team
) -> None:
    approval = gated(payables, reviewer_group="Treasury")
    treasury = Group.objects.create(name="Treasury")
    ours = member_of(payables, Role.REVIEWERS)
    theirs = member_of(procurement, Role.REVIEWERS)
    plain_reviewer = member_of(payables, Role.REVIEWERS)
    ours.groups.add(treasury)
    theirs.groups.add(treasury)

    assert approval_refusal(ours, approval) is None
    assert approval_refusal(theirs, approval) == (
        "you may not decide approvals of another team's runs"
    )
    assert "only members of Treasury" in (approval_refusal(plain_reviewer, approval) or "")


def test_queue_counts_and_lookups_narrow_to_the_persons_teams(
    payables: Team, procurement: Team
) -> None:
    ours, theirs = gated(payables), gated(procurement)
    reviewer = member_of(payables, Role.REVIEWERS)
    admin = user_with_role(Role.ADMINS)

    assert [a.pk for a in selectors.approval_queue(user=reviewer)] == [ours.pk]
    assert [a.pk for a in selectors.approval_decidable_by(reviewer)] == [ours.pk]
    assert selectors.approval_pending_count(reviewer) == 1
    assert selectors.needs_badge(reviewer).approvals == 1
    assert selectors.approval_get(ours.pk, user=reviewer) == ours
    with pytest.raises(Http404):
        selectors.approval_get(theirs.pk, user=reviewer)
    assert selectors.approval_pending_count(admin) == 2
    assert {a.pk for a in selectors.approval_decidable_by(admin)} == {ours.pk, theirs.pk}


def test_another_teams_decision_page_is_not_found(payables: Team, procurement: Team) -> None:
    approval = gated(payables)
    pages = {}
    for name, person in (
        ("ours", member_of(payables, Role.REVIEWERS)),
        ("stranger", member_of(procurement, Role.REVIEWERS)),
        ("admin", user_with_role(Role.ADMINS)),
    ):
        client = Client()
        client.force_login(person)
        pages[name] = client.get(f"/approvals/{approval.pk}/").status_code

    assert pages == {"ours": 200, "stranger": 404, "admin": 200}


def test_notices_go_only_to_people_of_the_runs_team(payables: Team, procurement: Team) -> None:
    approval = gated(payables)
    ours = member_of(payables, Role.REVIEWERS)
    member_of(procurement, Role.REVIEWERS)
    admin = user_with_role(Role.ADMINS)

    told = services._recipients(approval, groups=["Reviewers", "Admins"])

    assert {u.pk for u in told} == {ours.pk, admin.pk}


def test_an_assignee_removed_from_the_runs_team_is_told_no_more(
    payables: Team, procurement: Team
) -> None:
    approval = gated(payables)
    assignee = member_of(payables, Role.REVIEWERS)
    Membership.objects.create(team=procurement, user=assignee, role=Role.REVIEWERS.value)

    assert services._recipients(approval, groups=[], people=[assignee]) == [assignee]
    Membership.objects.filter(team=payables, user=assignee).delete()
    assert services._recipients(approval, groups=[], people=[assignee]) == []


def test_slack_says_in_words_that_it_is_another_teams_request(
    payables: Team, procurement: Team
) -> None:
    approval = gated(payables)
    stranger = member_of(procurement, Role.REVIEWERS)

    recorded, sentence = slack_callbacks._decide(
        user=stranger, value={"a": approval.pk, "h": approval.evidence_sha256}, approve=True
    )

    assert not recorded
    assert "You may not decide approvals of another team's runs." in sentence
    assert not approval.decisions.exists()


def test_a_question_is_answered_only_by_people_of_the_runs_team(
    payables: Team, procurement: Team
) -> None:
    run = waiting_run()
    Run.objects.filter(pk=run.pk).update(team=payables, status=Run.Status.AWAITING_ANSWER)
    run.refresh_from_db()
    question = Question.objects.create(
        run=run,
        expires_at=timezone.now() + timedelta(minutes=30),
        step_index=0,
        step_id="ask",
        text="Which cost centre?",
        kind=Question.Kind.TEXT,
        save_as="centre",
        answered_by=Role.REVIEWERS.value,
        timeout_minutes=30,
    )
    ours = member_of(payables, Role.REVIEWERS)
    stranger = member_of(procurement, Role.REVIEWERS)
    admin = user_with_role(Role.ADMINS)

    assert questions.question_refusal(ours, question) is None
    assert questions.question_refusal(stranger, question) == (
        "you may not answer questions of another team's runs"
    )
    assert [q.pk for q in selectors.questions_for(ours)] == [question.pk]
    assert selectors.questions_for(stranger) == []
    assert ours in questions.question_answerers(question)
    assert stranger not in questions.question_answerers(question)
    with pytest.raises(Http404):
        selectors.question_run_id(question.pk, user=stranger)
    assert selectors.question_run_id(question.pk, user=admin) == run.pk
