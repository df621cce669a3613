"""Admins make teams and say who holds which role; everyone sees their own teams."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from pandaweb.audit.models import AuditEvent
from pandaweb.core.models import Membership, Team
from pandaweb.core.roles import Role
from pandaweb.teams import services
from tests.factories import member_of, team_make, user_with_role

pytestmark = pytest.mark.django_db


def signed_in(user: object) -> Client:
    client = Client()
    client.force_login(user)  # type: ignore[arg-type]
    return client


def test_an_admin_makes_a_team_and_adds_a_reviewer() -> None:
    admin = signed_in(user_with_role(Role.ADMINS))
    pat = user_with_role(None, username="pat")

    made = admin.post("/teams/", {"name": "Accounts payable", "slug": ""})
    added = admin.post("/teams/accounts-payable/members/", {"username": "PAT", "role": "Reviewers"})

    assert made.status_code == 302
    assert made["Location"] == "/teams/accounts-payable/"
    assert added.status_code == 302
    team = Team.objects.get(slug="accounts-payable")
    assert list(Membership.objects.filter(team=team).values_list("user", "role")) == [
        (pat.pk, "Reviewers")
    ]
    page = admin.get("/teams/accounts-payable/").content.decode()
    assert "pat" in page
    assert "Reviewer" in page


def test_it_refuses_an_unknown_person_in_words_and_keeps_the_form() -> None:
    admin = signed_in(user_with_role(Role.ADMINS))
    team_make("payables")

    response = admin.post("/teams/payables/members/", {"username": "nobody", "role": "Reviewers"})

    assert response.status_code == 400
    page = response.content.decode()
    assert "Nobody here is called &#x27;nobody&#x27;" in page
    assert 'value="nobody"' in page
    assert not Membership.objects.exists()


def test_it_refuses_a_second_team_with_the_same_short_name() -> None:
    admin = signed_in(user_with_role(Role.ADMINS))
    team_make("payables")

    response = admin.post("/teams/", {"name": "Payables", "slug": "payables"})

    assert "A team called &#x27;payables&#x27; already exists" in response.content.decode()
    assert Team.objects.filter(slug="payables").count() == 1


def test_removing_a_role_takes_it_at_the_next_request() -> None:
    admin = signed_in(user_with_role(Role.ADMINS))
    payables = team_make("payables")
    person = member_of(payables, Role.OPERATORS)
    membership = Membership.objects.get(user=person)
    as_person = signed_in(person)
    assert as_person.get("/runs/").status_code == 200

    admin.post(f"/teams/payables/members/{membership.pk}/remove/")

    assert as_person.get("/runs/").status_code == 403
    assert AuditEvent.objects.filter(action="team.member_removed", team_id=payables.pk).exists()


def test_a_member_sees_only_their_teams_and_cannot_change_them() -> None:
    payables, procurement = team_make("payables"), team_make("procurement")
    person = member_of(payables, Role.OPERATORS, Role.REVIEWERS)
    client = signed_in(person)

    page = client.get("/teams/").content.decode()

    assert "Payables" in page
    assert "Operator, Reviewer" in page
    assert "Procurement" not in page
    assert client.get("/teams/payables/").status_code == 403
    assert client.post("/teams/", {"name": "Mine"}).status_code == 403
    assert (
        client.post(
            "/teams/procurement/members/", {"username": person.username, "role": "Operators"}
        ).status_code
        == 403
    )
    assert not Membership.objects.filter(team=procurement).exists()


def test_the_command_makes_teams_and_changes_roles() -> None:
    user_with_role(None, username="pat")
    out = StringIO()

    call_command("team", "create", "Procurement", stdout=out)
    call_command("team", "add", "procurement", "pat", "Operators", stdout=out)
    call_command("team", "list", stdout=out)
    call_command("team", "remove", "procurement", "pat", "Operators", stdout=out)

    assert out.getvalue().splitlines() == [
        "made team procurement (Procurement)",
        "pat is Operators in procurement",
        "default  Default team",
        "procurement  Procurement",
        "  pat                      Operators",
        "pat is no longer Operators in procurement",
    ]
    with pytest.raises(CommandError, match="no team called 'sales'"):
        call_command("team", "add", "sales", "pat", "Operators")


def test_the_services_refuse_a_person_who_is_not_an_administrator() -> None:
    team = team_make("payables")
    operator = member_of(team, Role.OPERATORS)
    events = AuditEvent.objects.count()

    with pytest.raises(services.TeamError, match="only administrators manage teams"):
        services.team_create(name="Mine", user=operator)
    with pytest.raises(services.TeamError, match="only administrators manage teams"):
        services.membership_grant(
            team_id=team.pk, member=operator, role=Role.REVIEWERS.value, user=operator
        )
    with pytest.raises(services.TeamError, match="only administrators manage teams"):
        services.membership_revoke(
            team_id=team.pk, member=operator, role=Role.OPERATORS.value, user=operator
        )

    assert not Team.objects.filter(slug="mine").exists()
    assert set(Membership.objects.filter(user=operator).values_list("role", flat=True)) == {
        Role.OPERATORS.value
    }
    assert AuditEvent.objects.count() == events
