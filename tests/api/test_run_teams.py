"""/api/v1 and webhooks per team: a token's owner lists and reads their teams' runs and
approvals only (another team's id is a 404); a subscription hears only its team's events."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from approvals.models import ApprovalRequest
from pandaweb.api import events_stream
from pandaweb.api.scopes import Scope
from pandaweb.api.services import TokenError, token_create, token_team_choices
from pandaweb.core.models import Team
from pandaweb.core.roles import Role
from pandaweb.webhooks import services as webhooks
from pandaweb.webhooks.models import Event, Message
from sessions.models import Run
from tests.api.conftest import Api
from tests.factories import member_of, team_make, user_with_role, waiting_run

pytestmark = pytest.mark.django_db


def gated(team: Team) -> ApprovalRequest:
    run = waiting_run()
    Run.objects.filter(pk=run.pk).update(team=team)
    run.refresh_from_db()
    return ApprovalRequest.objects.create(
        run=run,
        step_id="pay",
        action="Click it",
        evidence={},
        evidence_sha256="0" * 64,
        expires_at=timezone.now() + timedelta(hours=1),
    )


def test_runs_and_approvals_of_another_team_are_not_found(api_for: Callable[..., Any]) -> None:
    payables, procurement = team_make("payables"), team_make("procurement")
    ours, theirs = gated(payables), gated(procurement)
    apis = {
        "ours": api_for(member_of(payables, Role.REVIEWERS)),
        "stranger": api_for(member_of(procurement, Role.REVIEWERS)),
        "admin": api_for(user_with_role(Role.ADMINS)),
    }

    listed = {
        name: {
            "runs": {r["id"] for r in api.get("/runs/").json()["items"]},
            "approvals": {a["id"] for a in api.get("/approvals/").json()},
            "run": api.get(f"/runs/{ours.run_id}").status_code,
            "approval": api.get(f"/approvals/{ours.pk}").status_code,
        }
        for name, api in apis.items()
    }

    assert listed["ours"] == {
        "runs": {ours.run_id},
        "approvals": {ours.pk},
        "run": 200,
        "approval": 200,
    }
    assert listed["stranger"] == {
        "runs": {theirs.run_id},
        "approvals": {theirs.pk},
        "run": 404,
        "approval": 404,
    }
    assert listed["admin"]["runs"] == {ours.run_id, theirs.run_id}
    assert (listed["admin"]["run"], listed["admin"]["approval"]) == (200, 200)
    refused = apis["stranger"].post(
        f"/approvals/{ours.pk}/decision",
        {"verdict": "approve", "evidence_sha256": ours.evidence_sha256},
    )
    assert refused.status_code == 404
    assert not ours.decisions.exists()


def test_a_subscription_hears_only_its_teams_runs() -> None:
    payables, procurement = team_make("payables"), team_make("procurement")
    admin = user_with_role(Role.ADMINS)
    everything = [e.value for e in Event]
    ours, _ = webhooks.subscription_create(
        user=admin, name="AP", url="https://ap.test/hook", events=everything,
        workflow_id=None, team_id=payables.pk,
    )  # fmt: skip
    theirs, _ = webhooks.subscription_create(
        user=admin, name="Buying", url="https://buying.test/hook", events=everything,
        workflow_id=None, team_id=procurement.pk,
    )  # fmt: skip
    approval = gated(payables)

    with transaction.atomic():
        webhooks.outbox_record(event=Event.APPROVAL_REQUESTED, approval=approval)

    assert list(Message.objects.values_list("subscription_id", flat=True)) == [ours.pk]
    assert theirs.team_id == procurement.pk


def test_making_a_subscription_says_which_team_when_it_cannot_tell() -> None:
    team_make("payables")
    team_make("procurement")
    admin = user_with_role(Role.ADMINS)
    only_here = member_of(team_make("treasury"), Role.OPERATORS)

    with pytest.raises(webhooks.WebhookError, match="say which team") as refused:
        webhooks.subscription_create(
            user=admin, name="AP", url="https://ap.test/hook",
            events=[Event.RUN_FINISHED.value], workflow_id=None,
        )  # fmt: skip

    assert "Payables" in refused.value.field_errors["team"][0]
    with pytest.raises(webhooks.WebhookError, match="no team"):
        webhooks.subscription_create(
            user=only_here, name="AP", url="https://ap.test/hook",
            events=[Event.RUN_FINISHED.value], workflow_id=None,
        )  # fmt: skip


def test_a_token_limited_to_one_team_reaches_that_team_only() -> None:
    """An admin's token (every team) limited to payables: payables' run and approval only, no
    installation-wide right, and every token it makes is limited to payables too."""
    payables, procurement = team_make("payables"), team_make("procurement")
    ours, theirs = gated(payables), gated(procurement)
    admin = user_with_role(Role.ADMINS)
    scopes = [s.value for s in Scope]
    _, raw = token_create(
        actor=admin, owner=admin, name="payables only", scopes=scopes, expires_at=None,
        team="payables",
    )  # fmt: skip
    api = Api(raw)

    assert {r["id"] for r in api.get("/runs/").json()["items"]} == {ours.run_id}
    assert api.get(f"/runs/{theirs.run_id}").status_code == 404
    assert api.get(f"/approvals/{theirs.pk}").status_code == 404
    assert api.get(f"/approvals/{ours.pk}").status_code == 200
    assert api.get("/service-accounts/").status_code == 403
    viewer = events_stream.viewer_get(raw)
    assert viewer is not None
    assert (viewer.run_teams, viewer.approval_teams) == ({payables.pk}, {payables.pk})
    mine = api.get("/tokens/").json()
    assert [t["team"] for t in mine] == ["payables"]

    widened = api.post(
        "/tokens/", {"name": "wider", "scopes": ["runs:read"], "team": "procurement"}
    )
    inherited = api.post("/tokens/", {"name": "same", "scopes": ["runs:read"]})

    assert widened.status_code == 422
    assert widened.json()["errors"][0]["field"] == "team"
    assert inherited.status_code == 201
    assert inherited.json()["team"] == "payables"


def test_a_token_is_limited_only_to_a_team_its_owner_is_in() -> None:
    payables = team_make("payables")
    team_make("procurement")
    operator = member_of(payables, Role.OPERATORS)

    with pytest.raises(TokenError) as refused:
        token_create(
            actor=operator, owner=operator, name="t", scopes=["runs:read"], expires_at=None,
            team="procurement",
        )  # fmt: skip

    assert refused.value.field_errors["team"] == [
        f"{operator.get_username()} is in no team called 'procurement'."
    ]
    assert token_team_choices(operator) == [("payables", "Payables")]
