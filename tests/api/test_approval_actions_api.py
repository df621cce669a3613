"""Commenting on an approval request and handing it over through /api/v1/: the dashboard's
services and rules, their refusals in words, the audit trail, the scopes and the team rule."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import ApprovalComment, ApprovalDecision, ApprovalRequest
from pandaweb.api.services import TokenError
from pandaweb.audit.models import AuditEvent
from pandaweb.core.models import Membership, Team
from pandaweb.core.roles import Capability, Role
from sessions.models import Run
from tests.api.conftest import Api, make_token
from tests.api.test_api import pending_approval, problem
from tests.factories import member_of, user_with_role
from tests.patching import patch_dispatch

pytestmark = pytest.mark.django_db

MISSING_ID = 987654


@pytest.fixture(autouse=True)
def nothing_dispatched(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rejection closes the run; nothing it queues runs here."""
    patch_dispatch(monkeypatch, lambda task, queue=None, **kwargs: None)


@pytest.fixture
def approval() -> ApprovalRequest:
    return pending_approval()


@pytest.fixture
def launcher(approval: ApprovalRequest) -> User:
    return User.objects.get(pk=approval.run.launched_by_id)


@pytest.fixture
def treasurer(db: None) -> User:
    """A member of a group that decides approvals without being a workflow's reviewer group."""
    group = Group.objects.create(name="Treasury")
    group.permissions.add(
        *Permission.objects.filter(
            content_type__app_label="core",
            codename__in=[Capability.DECIDE_APPROVALS.value, Capability.VIEW_APPROVALS.value],
        )
    )
    user = user_with_role(None, username="tess")
    user.groups.add(group)
    return user


def comment(api: Api, approval_id: int, body: str) -> Any:
    return api.post(f"/approvals/{approval_id}/comments", {"body": body})


def hand_over(api: Api, approval_id: int, **body: str) -> Any:
    return api.post(f"/approvals/{approval_id}/assignee", body)


def events(approval: ApprovalRequest, action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action, approval_id=approval.pk))


# Comments ----------------------------------------------------------------------------------------


def test_a_reviewer_comments_and_the_request_shows_it(
    reviewer: User, approval: ApprovalRequest
) -> None:
    api = Api(make_token(reviewer))

    response = comment(api, approval.pk, "  The IBAN matches the contract.  ")

    assert response.status_code == 201, response.content
    made = response.json()
    stored = ApprovalComment.objects.get()
    assert made["id"] == stored.pk
    assert (made["author"], made["body"]) == ("rory", "The IBAN matches the contract.")
    assert (stored.request_id, stored.author, stored.body) == (
        approval.pk,
        reviewer,
        "The IBAN matches the contract.",
    )
    [event] = events(approval, "approval.commented")
    assert event.actor == reviewer
    assert event.after == {"comment_id": stored.pk, "body": "The IBAN matches the contract."}
    assert event.extra["via"]["channel"] == "api"
    # A comment is never a verdict.
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING
    assert not ApprovalDecision.objects.exists()
    shown = api.get(f"/approvals/{approval.pk}").json()
    assert [(c["id"], c["author"], c["body"]) for c in shown["comments"]] == [
        (stored.pk, "rory", "The IBAN matches the contract.")
    ]


def test_people_who_may_open_the_request_comment_without_deciding(
    approval: ApprovalRequest, launcher: User, compliance: User
) -> None:
    # The launcher follows their own run's request (never decides it); compliance reads the
    # queue and decides nothing: both comment, with nothing but the comment scope.
    own = comment(Api(make_token(launcher, ["approvals:comment"])), approval.pk, "Due today")
    audit = comment(Api(make_token(compliance, ["approvals:comment"])), approval.pk, "Noted")

    assert (own.status_code, audit.status_code) == (201, 201), (own.content, audit.content)
    assert list(ApprovalComment.objects.values_list("author__username", "body")) == [
        (launcher.username, "Due today"),
        ("carla", "Noted"),
    ]


def test_a_comment_on_a_decided_request_is_still_taken(
    reviewer: User, approval: ApprovalRequest
) -> None:
    api = Api(make_token(reviewer))
    rejected = api.post(
        f"/approvals/{approval.pk}/decision",
        {"verdict": "reject", "evidence_sha256": approval.evidence_sha256, "reason": "wrong"},
    )
    assert rejected.status_code == 200, rejected.content

    assert comment(api, approval.pk, "Rejected: the amount was wrong").status_code == 201
    assert ApprovalComment.objects.count() == 1


def test_an_empty_or_overlong_comment_is_refused_on_its_field(
    reviewer: User, approval: ApprovalRequest
) -> None:
    api = Api(make_token(reviewer))

    empty = problem(comment(api, approval.pk, "   "), 422)
    overlong = problem(comment(api, approval.pk, "x" * 4001), 422)

    assert empty["detail"] == "a comment needs some text"
    assert empty["errors"] == [{"field": "body", "message": "Write your comment."}]
    assert overlong["detail"] == "a comment is at most 4000 characters"
    assert overlong["errors"] == [{"field": "body", "message": "Shorten it."}]
    assert not ApprovalComment.objects.exists()
    assert events(approval, "approval.commented") == []


def test_someone_of_the_team_who_may_not_open_the_request_cannot_comment(
    operator: User, approval: ApprovalRequest
) -> None:
    # An operator watches the team's runs but does not see its queue, and did not launch this.
    refused = problem(comment(Api(make_token(operator)), approval.pk, "hi"), 403)

    assert refused["type"].endswith("/comment-refused")
    assert refused["detail"] == "you are not allowed to see this request"
    assert not ApprovalComment.objects.exists()


def test_commenting_needs_its_own_scope(
    reviewer: User, stranger: User, approval: ApprovalRequest
) -> None:
    reader = Api(make_token(reviewer, ["approvals:read", "approvals:decide"]))

    refused = problem(comment(reader, approval.pk, "hi"), 403)
    missing = problem(comment(reader, MISSING_ID, "hi"), 403)

    assert refused["type"].endswith("/missing-scope")
    assert (
        refused["detail"] == missing["detail"] == "this token lacks the scope 'approvals:comment'"
    )
    assert not ApprovalComment.objects.exists()
    # Someone who watches no runs cannot be given it at all.
    with pytest.raises(TokenError):
        make_token(stranger, ["approvals:comment"])


# What the request shows --------------------------------------------------------------------------


def test_a_request_shows_its_reviewers_and_comments_in_the_same_number_of_queries(
    reviewer: User, second_reviewer: User, compliance: User, approval: ApprovalRequest
) -> None:
    api = Api(make_token(reviewer))
    api.get(f"/approvals/{approval.pk}")  # the token's first use of the minute writes its time
    with CaptureQueriesContext(connection) as bare:
        before = api.get(f"/approvals/{approval.pk}").json()
    for person, body in ((reviewer, "Checked"), (second_reviewer, "Agreed"), (compliance, "Ok")):
        comment(Api(make_token(person)), approval.pk, body)
    hand_over(api, approval.pk, username="rita")
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        escalated_at=timezone.now(), escalation_group="Treasury"
    )

    with CaptureQueriesContext(connection) as full:
        after = api.get(f"/approvals/{approval.pk}").json()

    assert (before["reviewer_group"], before["assignee"], before["escalated_to"]) == (
        "Reviewers",
        None,
        None,
    )
    assert before["comments"] == []
    assert (after["reviewer_group"], after["assignee"], after["escalated_to"]) == (
        "Reviewers",
        "rita",
        "Treasury",
    )
    assert [(c["author"], c["body"]) for c in after["comments"]] == [
        ("rory", "Checked"),
        ("rita", "Agreed"),
        ("carla", "Ok"),
    ]
    assert len(full) == len(bare), [q["sql"] for q in full]


# Hand-over ---------------------------------------------------------------------------------------


def test_a_reviewer_hands_a_request_to_another_who_may_decide_it(
    reviewer: User, second_reviewer: User, approval: ApprovalRequest
) -> None:
    response = hand_over(
        Api(make_token(reviewer)), approval.pk, username="rita", note="I know the payee"
    )

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["id"], body["assignee"], body["reviewer_group"]) == (
        approval.pk,
        "rita",
        "Reviewers",
    )
    approval.refresh_from_db()
    assert approval.assignee == second_reviewer
    assert approval.status == ApprovalRequest.Status.PENDING
    [event] = events(approval, "approval.reassigned")
    assert event.actor == reviewer
    assert event.before == {"assignee": None, "group": "Reviewers"}
    assert event.after == {"assignee": "rita", "group": "Reviewers", "note": "I know the payee"}
    assert event.extra["via"]["channel"] == "api"


def test_a_request_handed_to_a_group_is_that_groups_to_decide(
    reviewer: User, second_reviewer: User, treasurer: User, approval: ApprovalRequest
) -> None:
    response = hand_over(Api(make_token(reviewer)), approval.pk, group="Treasury")

    assert response.status_code == 200, response.content
    assert (response.json()["reviewer_group"], response.json()["assignee"]) == ("Treasury", None)
    approval.refresh_from_db()
    assert (approval.reviewer_group, approval.assignee) == ("Treasury", None)
    decision = {"verdict": "reject", "evidence_sha256": approval.evidence_sha256, "reason": "no"}
    refused = Api(make_token(second_reviewer)).post(f"/approvals/{approval.pk}/decision", decision)
    assert "only members of Treasury decide" in problem(refused, 403)["detail"]
    decided = Api(make_token(treasurer)).post(f"/approvals/{approval.pk}/decision", decision)
    assert decided.status_code == 200, decided.content


def test_it_refuses_to_hand_over_to_someone_who_may_not_decide_in_the_services_words(
    reviewer: User, operator: User, launcher: User, approval: ApprovalRequest
) -> None:
    api = Api(make_token(reviewer))
    # The launcher is never a way round the four-eyes rule, even as a reviewer.
    launcher.groups.add(Group.objects.get(name=Role.REVIEWERS.value))

    watcher = problem(hand_over(api, approval.pk, username="olivia"), 409)
    own_run = problem(hand_over(api, approval.pk, username=launcher.username), 409)
    not_deciding = problem(hand_over(api, approval.pk, group="Operators"), 409)

    assert watcher["type"].endswith("/handover-refused")
    assert watcher["detail"] == (
        "olivia cannot decide this request: you are not allowed to decide approvals"
    )
    assert own_run["detail"] == (
        f"{launcher.username} cannot decide this request: "
        "you launched this run: someone else has to approve it"
    )
    assert not_deciding["detail"] == "Operators is not a group whose members decide approvals"
    approval.refresh_from_db()
    assert (approval.assignee, approval.reviewer_group) == (None, "Reviewers")
    assert events(approval, "approval.reassigned") == []


def test_only_someone_who_may_decide_the_request_hands_it_over(
    reviewer: User, launcher: User, approval: ApprovalRequest
) -> None:
    launcher.groups.add(Group.objects.get(name=Role.REVIEWERS.value))
    # Loaded afresh, as a request loads its user: permissions are cached on the object.
    own = Api(make_token(User.objects.get(pk=launcher.pk)))

    refused = problem(hand_over(own, approval.pk, username="rory"), 403)

    assert refused["type"].endswith("/handover-refused")
    assert refused["detail"] == "you launched this run: someone else has to approve it"
    approval.refresh_from_db()
    assert approval.assignee is None
    assert events(approval, "approval.reassigned") == []


def test_a_decided_request_is_not_handed_over(
    reviewer: User, second_reviewer: User, approval: ApprovalRequest
) -> None:
    api = Api(make_token(reviewer))
    api.post(
        f"/approvals/{approval.pk}/decision",
        {"verdict": "reject", "evidence_sha256": approval.evidence_sha256, "reason": "wrong"},
    )

    refused = problem(hand_over(api, approval.pk, username="rita"), 409)

    assert refused["detail"] == "this request is already rejected"
    approval.refresh_from_db()
    assert approval.assignee is None


def test_who_to_hand_to_is_checked_field_by_field(
    reviewer: User, approval: ApprovalRequest, procurement: Team
) -> None:
    api = Api(make_token(reviewer))
    # A reviewer of another team exists, and is answered as nobody is.
    member_of(procurement, Role.REVIEWERS, username="pia")

    unknown = problem(hand_over(api, approval.pk, username="ghost"), 422)
    elsewhere = problem(hand_over(api, approval.pk, username="pia"), 422)
    no_group = problem(hand_over(api, approval.pk, group="Nobody"), 422)
    neither = problem(hand_over(api, approval.pk, note="yours"), 422)
    both = problem(hand_over(api, approval.pk, username="rita", group="Reviewers"), 422)

    assert unknown["errors"] == [
        {"field": "username", "message": "nobody named 'ghost' is in this run's team"}
    ]
    assert elsewhere["errors"] == [
        {"field": "username", "message": "nobody named 'pia' is in this run's team"}
    ]
    assert no_group["errors"] == [{"field": "group", "message": "there is no group named 'Nobody'"}]
    one = [{"field": "", "message": "name one person (username) or one group (group)"}]
    assert neither["errors"] == both["errors"] == one
    assert events(approval, "approval.reassigned") == []


def test_handing_over_needs_the_decide_scope(
    reviewer: User, compliance: User, approval: ApprovalRequest
) -> None:
    reader = Api(make_token(reviewer, ["approvals:read", "approvals:comment"]))

    refused = problem(hand_over(reader, approval.pk, username="rita"), 403)

    assert refused["type"].endswith("/missing-scope")
    assert refused["detail"] == "this token lacks the scope 'approvals:decide'"
    with pytest.raises(TokenError):
        make_token(compliance, ["approvals:decide"])
    approval.refresh_from_db()
    assert approval.assignee is None


# Teams and the API's description -----------------------------------------------------------------


def test_another_teams_request_answers_as_a_missing_one(
    approval: ApprovalRequest, payables: Team, procurement: Team
) -> None:
    Run.objects.filter(pk=approval.run_id).update(team=procurement)
    api = Api(make_token(member_of(payables, Role.REVIEWERS, username="pat")))

    for theirs, missing in (
        (comment(api, approval.pk, "hi"), comment(api, MISSING_ID, "hi")),
        (
            hand_over(api, approval.pk, group="Reviewers"),
            hand_over(api, MISSING_ID, group="Reviewers"),
        ),
    ):
        found, absent = problem(theirs, 404), problem(missing, 404)
        assert (found["detail"], found["type"]) == (absent["detail"], absent["type"])
    approval.refresh_from_db()
    assert (approval.reviewer_group, ApprovalComment.objects.count()) == ("Reviewers", 0)


def test_a_reviewer_of_one_team_does_not_read_the_queue_of_a_team_they_only_operate_in(
    approval: ApprovalRequest, payables: Team, procurement: Team
) -> None:
    Run.objects.filter(pk=approval.run_id).update(team=procurement)
    both = member_of(payables, Role.REVIEWERS, username="pat")
    Membership.objects.create(team=procurement, user=both, role=Role.OPERATORS.value)
    api = Api(make_token(both))

    refused = problem(api.get(f"/approvals/{approval.pk}"), 403)

    assert refused["detail"] == "you may not see this request"
    # The page says no too: the API opens no more than the dashboard.
    page = Client()
    page.force_login(both)
    assert page.get(f"/approvals/{approval.pk}/").status_code == 403


def test_both_actions_are_in_the_openapi_document_with_their_scope(client: Client) -> None:
    paths = json.loads(client.get("/api/v1/openapi.json").content)["paths"]

    expected = {
        "/api/v1/approvals/{approval_id}/comments": "approvals:comment",
        "/api/v1/approvals/{approval_id}/assignee": "approvals:decide",
    }
    for path, scope in expected.items():
        operation = paths[path]["post"]
        assert f"Scope: ``{scope}``" in operation["description"], path
        assert operation["summary"][0].isupper(), path
    assert "201" in paths["/api/v1/approvals/{approval_id}/comments"]["post"]["responses"]
    shown = paths["/api/v1/approvals/{approval_id}"]["get"]["responses"]["200"]
    assert shown["content"]["application/json"]["schema"]["$ref"].endswith("/ApprovalOut")
