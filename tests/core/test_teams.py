"""Teams at the bottom: who holds what where, and the run services' own team rule."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from pandaweb.api.services import effective_scopes
from pandaweb.audit.models import AuditEvent
from pandaweb.core.models import DEFAULT_TEAM_SLUG, Membership, Team
from pandaweb.core.permissions import in_teams, teams_where, user_can
from pandaweb.core.roles import Capability, Role
from pandaweb.teams.services import TeamError, membership_grant, membership_revoke, team_create
from sessions.models import Run
from sessions.services import RunError, run_cancel, run_launch
from tests.factories import member_of, user_with_role, waiting_run
from workflows.models import Workflow

pytestmark = pytest.mark.django_db


def test_a_team_role_grants_its_capabilities_in_that_team_only(
    payables: Team, procurement: Team
) -> None:
    person = member_of(payables, Role.OPERATORS)
    member_of(procurement, Role.REVIEWERS, username="someone-else")
    Membership.objects.create(team=procurement, user=person, role=Role.REVIEWERS.value)

    assert teams_where(person, Capability.LAUNCH_RUNS) == {payables.pk}
    assert teams_where(person, Capability.DECIDE_APPROVALS) == {procurement.pk}
    assert teams_where(person, Capability.VIEW_RUNS) == {payables.pk, procurement.pk}
    assert user_can(person, Capability.LAUNCH_RUNS, team_id=payables.pk)
    assert not user_can(person, Capability.LAUNCH_RUNS, team_id=procurement.pk)
    assert user_can(person, Capability.LAUNCH_RUNS)  # somewhere: the page may be shown
    assert not user_can(person, Capability.VIEW_AUDIT)


def test_a_global_role_reaches_every_team_and_no_role_reaches_none(payables: Team) -> None:
    admin = user_with_role(Role.ADMINS)
    nobody = user_with_role(None)

    assert teams_where(admin, Capability.DECIDE_APPROVALS) is None
    assert user_can(admin, Capability.LAUNCH_RUNS, team_id=payables.pk)
    assert teams_where(nobody, Capability.VIEW_RUNS) == frozenset()
    assert not user_can(nobody, Capability.VIEW_RUNS)


def test_a_deactivated_member_holds_nothing(payables: Team) -> None:
    person = member_of(payables, Role.OPERATORS)
    person.is_active = False

    assert teams_where(person, Capability.VIEW_RUNS) == frozenset()


def test_lists_narrow_to_the_persons_teams(payables: Team, procurement: Team) -> None:
    ours, theirs = waiting_run(), waiting_run()
    Run.objects.filter(pk=theirs.pk).update(team=procurement)
    Run.objects.filter(pk=ours.pk).update(team=payables)
    person = member_of(payables, Role.REVIEWERS)

    visible = in_teams(Run.objects.all(), person, Capability.VIEW_RUNS)

    assert list(visible.values_list("pk", flat=True)) == [ours.pk]


def test_what_existed_before_teams_is_in_the_default_team() -> None:
    run = waiting_run()

    assert run.team.slug == DEFAULT_TEAM_SLUG
    assert run.workflow.team_id == run.team_id


def test_a_run_belongs_to_its_workflows_team_and_only_that_teams_operators_launch_it(
    payables: Team, procurement: Team
) -> None:
    workflow = waiting_run().workflow
    Workflow.objects.filter(pk=workflow.pk).update(team=payables)
    ours = member_of(payables, Role.OPERATORS)
    stranger = member_of(procurement, Role.OPERATORS)

    run = run_launch(workflow_id=workflow.pk, user=ours, raw_inputs={})
    with pytest.raises(RunError, match="may not launch runs of Payables's workflows"):
        run_launch(workflow_id=workflow.pk, user=stranger, raw_inputs={})

    assert run.team_id == payables.pk
    assert Run.objects.filter(workflow=workflow, launched_by=stranger).count() == 0


def test_another_teams_operator_cannot_cancel_a_run(payables: Team, procurement: Team) -> None:
    run = waiting_run()
    Run.objects.filter(pk=run.pk).update(team=payables)
    stranger = member_of(procurement, Role.OPERATORS)

    with pytest.raises(RunError, match="another team's runs"):
        run_cancel(run_id=run.pk, user=stranger)

    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL


def test_a_token_owners_team_roles_count_for_its_scopes(payables: Team) -> None:
    person = member_of(payables, Role.REVIEWERS)

    granted = effective_scopes(person, ["approvals:decide", "runs:launch", "runs:read"])

    assert {str(s) for s in granted} == {"approvals:decide", "runs:read"}


def test_teams_and_memberships_change_with_an_audit_event() -> None:
    admin = user_with_role(Role.ADMINS)
    person = user_with_role(None, username="pat")

    team = team_create(name="Accounts payable", user=admin)
    membership_grant(team_id=team.pk, member=person, role=Role.OPERATORS.value, user=admin)
    membership_grant(team_id=team.pk, member=person, role=Role.OPERATORS.value, user=admin)
    assert membership_revoke(team_id=team.pk, member=person, role="Operators", user=admin)
    assert not membership_revoke(team_id=team.pk, member=person, role="Operators", user=admin)

    assert team.slug == "accounts-payable"
    actions = list(AuditEvent.objects.filter(team_id=team.pk).values_list("action", flat=True))
    assert actions == ["team.created", "team.member_added", "team.member_removed"]
    with pytest.raises(TeamError, match="already exists"):
        team_create(name="Accounts payable", user=admin)
    with pytest.raises(TeamError, match="not a team role"):
        membership_grant(team_id=team.pk, member=person, role="Admins", user=admin)


def test_a_persons_roles_are_read_once_per_user_object(
    payables: Team, django_assert_num_queries: object
) -> None:
    person = User.objects.get(pk=member_of(payables, Role.OPERATORS).pk)

    teams_where(person, Capability.VIEW_RUNS)
    with django_assert_num_queries(0):  # type: ignore[operator]
        teams_where(person, Capability.VIEW_RUNS)
