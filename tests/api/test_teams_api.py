"""Teams over the API: the Teams pages' selectors, services and rules. Everyone reads their own
teams; admins read every team and its people, make teams and give and take roles, with the
pages' audit events; another team is answered as a missing one; a token limited to one team
holds no admin's right."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from pandaweb_client import ApiError
from pandaweb_client import Client as PandawebClient
from pandaweb_client.cli import main as pandaweb_command
from pytest_django.live_server_helper import LiveServer

from pandaweb.api.services import token_create
from pandaweb.audit.models import AuditEvent
from pandaweb.core.models import Membership, Team
from pandaweb.core.roles import Role
from tests.api.conftest import Api, make_token
from tests.api.test_api import problem
from tests.api.test_tokens_api import fields
from tests.factories import member_of, team_make, user_with_role
from workflows.models import Workflow

pytestmark = pytest.mark.django_db

READ, WRITE = "teams:read", "teams:write"
BOTH = [READ, WRITE]


@pytest.fixture
def admin(db: None) -> User:
    return user_with_role(Role.ADMINS, username="ada")


def team_events() -> list[tuple[str, str, int | None, Any]]:
    found = AuditEvent.objects.filter(action__startswith="team.").order_by("sequence")
    return [
        (e.action, e.actor.get_username() if e.actor else "", e.team_id, e.after or e.before)
        for e in found.select_related("actor")
    ]


def held(team: Team) -> set[tuple[str, str]]:
    return set(Membership.objects.filter(team=team).values_list("user__username", "role"))


def workflow_in(team: Team, slug: str, owner: User) -> Workflow:
    reviewers, _ = Group.objects.get_or_create(name=Role.REVIEWERS.value)
    return Workflow.objects.create(
        name=slug.title(), slug=slug, team=team, owner=owner, reviewer_group=reviewers
    )


# Reading ------------------------------------------------------------------------------------------


def test_a_member_lists_only_their_teams_with_their_roles(
    payables: Team, procurement: Team
) -> None:
    person = member_of(payables, Role.REVIEWERS, Role.OPERATORS, username="pat")
    member_of(payables, Role.OPERATORS, username="olga")

    listed = Api(make_token(person, [READ])).get("/teams/").json()

    assert listed == [
        {
            "slug": "payables",
            "name": "Payables",
            "my_roles": ["Operators", "Reviewers"],
            "people": None,
            "workflows": None,
            "created_at": listed[0]["created_at"],
            "links": {
                "self": "/api/v1/teams/payables",
                "add_member": "/api/v1/teams/payables/members",
            },
        }
    ]


def test_an_admin_lists_every_team_with_its_people_and_workflows(
    admin: User, payables: Team, procurement: Team, ours: User, theirs: User
) -> None:
    member_of(payables, Role.REVIEWERS, username="rita")
    Membership.objects.create(team=procurement, user=admin, role=Role.COMPLIANCE.value)
    workflow_in(payables, "pay-invoice", ours)
    workflow_in(payables, "pay-supplier", ours)

    listed = Api(make_token(admin, [READ])).get("/teams/").json()

    rows = {t["slug"]: (t["my_roles"], t["people"], t["workflows"]) for t in listed}
    assert rows["payables"] == ([], 2, 2)
    assert rows["procurement"] == (["Compliance"], 2, 0)
    assert set(rows) == set(Team.objects.values_list("slug", flat=True))


def test_a_member_reads_their_team_but_not_who_else_is_in_it(payables: Team, ours: User) -> None:
    member_of(payables, Role.REVIEWERS, username="rita")

    team = Api(make_token(ours, [READ])).get("/teams/payables").json()

    assert (team["slug"], team["my_roles"]) == ("payables", ["Operators"])
    assert team["members"] is None
    assert team["people"] is None


def test_another_team_answers_exactly_as_a_missing_one(
    payables: Team, procurement: Team, ours: User, theirs: User
) -> None:
    api = Api(make_token(ours, BOTH))

    theirs_answer = api.get("/teams/procurement")
    missing = api.get("/teams/no-such-team")

    assert problem(theirs_answer, 404)["detail"] == problem(missing, 404)["detail"]
    assert theirs_answer.content.replace(b"procurement", b"no-such-team") == missing.content
    assert b"procurement" not in api.get("/teams/").content


def test_an_admin_reads_who_holds_which_role(admin: User, payables: Team) -> None:
    member_of(payables, Role.OPERATORS, Role.REVIEWERS, username="pat")
    member_of(payables, Role.COMPLIANCE, username="carla")

    team = Api(make_token(admin, [READ])).get("/teams/payables").json()

    assert team["members"] == [
        {"username": "carla", "roles": ["Compliance"]},
        {"username": "pat", "roles": ["Operators", "Reviewers"]},
    ]
    assert team["people"] == 2


# Changing (admins) --------------------------------------------------------------------------------


def test_an_admin_makes_a_team_gives_and_takes_a_role_each_audited(admin: User) -> None:
    pat = user_with_role(None, username="pat")
    api = Api(make_token(admin, BOTH))

    made = api.post("/teams/", {"name": "Accounts payable"})
    added = api.post("/teams/accounts-payable/members", {"username": "PAT", "role": "Reviewers"})
    again = api.post("/teams/accounts-payable/members", {"username": "pat", "role": "Reviewers"})
    removed = api.client.delete(
        "/api/v1/teams/accounts-payable/members/pat/Reviewers", headers=api._headers(None)
    )

    assert made.status_code == 201, made.content
    assert made.json()["slug"] == "accounts-payable"
    assert made.json()["members"] == []
    assert added.status_code == 200, added.content
    assert added.json()["members"] == [{"username": "pat", "roles": ["Reviewers"]}]
    assert again.json()["members"] == added.json()["members"]
    assert removed.status_code == 200, removed.content
    assert removed.json()["members"] == []
    team = Team.objects.get(slug="accounts-payable")
    assert held(team) == set()
    assert not pat.team_memberships.exists()
    assert team_events() == [
        ("team.created", "ada", team.pk, {"slug": "accounts-payable", "name": "Accounts payable"}),
        ("team.member_added", "ada", team.pk, {"member": "pat", "role": "Reviewers"}),
        ("team.member_removed", "ada", team.pk, {"member": "pat", "role": "Reviewers"}),
    ]


def test_a_role_granted_takes_effect_at_the_owners_next_request(
    admin: User, payables: Team
) -> None:
    pat = user_with_role(None, username="pat")
    pats = Api(make_token(pat, [READ]))
    assert pats.get("/teams/").json() == []

    Api(make_token(admin, BOTH)).post(
        "/teams/payables/members", {"username": "pat", "role": "Operators"}
    )

    assert [t["slug"] for t in pats.get("/teams/").json()] == ["payables"]


def test_it_refuses_in_words_with_the_field_at_fault(admin: User, payables: Team) -> None:
    user_with_role(None, username="pat")
    gone = user_with_role(None, username="gone")
    gone.is_active = False
    gone.save()
    api = Api(make_token(admin, BOTH))
    events = AuditEvent.objects.count()

    nobody = api.post("/teams/payables/members", {"username": "nobody", "role": "Reviewers"})
    inactive = api.post("/teams/payables/members", {"username": "gone", "role": "Reviewers"})
    king = api.post("/teams/payables/members", {"username": "pat", "role": "Kings"})
    admins = api.post("/teams/payables/members", {"username": "pat", "role": "Admins"})
    unnamed = api.post("/teams/", {"name": "  "})
    bad_slug = api.post("/teams/", {"name": "Sales", "slug": "sales/emea"})
    taken = api.post("/teams/", {"name": "Payables again", "slug": "payables"})
    missing = api.post("/teams/sales/members", {"username": "pat", "role": "Reviewers"})
    remove_role = api.client.delete(
        "/api/v1/teams/payables/members/pat/Kings", headers=api._headers(None)
    )

    assert fields(problem(nobody, 422)) == {"username": "nobody here is called 'nobody'"}
    assert fields(problem(inactive, 422)) == {"username": "nobody here is called 'gone'"}
    roles = "choose one of Operators, Reviewers, Compliance"
    assert fields(problem(king, 422)) == {"role": f"'Kings' is not a team role: {roles}"}
    assert fields(problem(admins, 422)) == {"role": f"'Admins' is not a team role: {roles}"}
    assert fields(problem(remove_role, 422)) == {"role": f"'Kings' is not a team role: {roles}"}
    assert fields(problem(unnamed, 422)) == {"name": "give the team a name"}
    assert fields(problem(bad_slug, 422)) == {
        "slug": "give the team a short name of letters, digits and hyphens (63 at most)"
    }
    conflict = problem(taken, 409)
    assert conflict["detail"] == "a team called 'payables' already exists"
    assert conflict["type"].endswith("team-exists")
    assert fields(conflict) == {"slug": "a team called 'payables' already exists"}
    problem(missing, 404)
    assert list(Team.objects.values_list("slug", flat=True).order_by("slug")) == [
        "default",
        "payables",
    ]
    assert held(payables) == set()
    assert AuditEvent.objects.count() == events


def test_someone_who_is_not_an_admin_is_refused_before_any_team_is_looked_up(
    payables: Team, procurement: Team, ours: User
) -> None:
    api = Api(make_token(ours, BOTH))
    events = AuditEvent.objects.count()

    refusals = [
        api.post("/teams/", {"name": "Mine"}),
        api.post("/teams/payables/members", {"username": "paula", "role": "Reviewers"}),
        api.post("/teams/procurement/members", {"username": "paula", "role": "Operators"}),
        api.post("/teams/no-such-team/members", {"username": "paula", "role": "Operators"}),
        api.client.delete(
            "/api/v1/teams/payables/members/paula/Operators", headers=api._headers(None)
        ),
    ]

    for refused in refusals:
        assert problem(refused, 403)["detail"] == "teams and their members are managed by admins"
    assert not Team.objects.filter(slug="mine").exists()
    assert held(payables) == {("paula", "Operators")}
    assert held(procurement) == set()
    assert AuditEvent.objects.count() == events


def test_an_admins_token_limited_to_one_team_holds_no_admin_right(
    admin: User, payables: Team, procurement: Team, ours: User
) -> None:
    Membership.objects.create(team=payables, user=admin, role=Role.REVIEWERS.value)
    Membership.objects.create(team=procurement, user=admin, role=Role.REVIEWERS.value)
    _, raw = token_create(
        actor=admin, owner=admin, name="payables only", scopes=BOTH, expires_at=None,
        team="payables",
    )  # fmt: skip
    api = Api(raw)

    listed = api.get("/teams/").json()
    team = api.get("/teams/payables").json()
    other = api.get("/teams/procurement")
    refused = api.post("/teams/payables/members", {"username": "paula", "role": "Reviewers"})
    made = api.post("/teams/", {"name": "Mine"})

    assert [(t["slug"], t["my_roles"], t["people"]) for t in listed] == [
        ("payables", ["Reviewers"], None)
    ]
    assert team["members"] is None
    problem(other, 404)
    assert problem(refused, 403)["detail"] == (
        "a token limited to one team manages no teams: teams and their members are managed by "
        "admins"
    )
    problem(made, 403)
    assert held(payables) == {("ada", "Reviewers"), ("paula", "Operators")}
    assert not Team.objects.filter(slug="mine").exists()


def test_a_person_with_no_role_reads_no_team_and_the_scopes_are_checked_first(
    payables: Team, ours: User
) -> None:
    stranger = user_with_role(None, username="sam")

    assert Api(make_token(stranger, [READ])).get("/teams/").json() == []
    problem(Api(make_token(stranger, [READ])).get("/teams/payables"), 404)
    without_read = problem(Api(make_token(ours, [WRITE])).get("/teams/"), 403)
    without_write = problem(Api(make_token(ours, [READ])).post("/teams/", {"name": "x"}), 403)
    assert without_read["type"].endswith("missing-scope")
    assert without_write["type"].endswith("missing-scope")


def test_every_team_endpoint_is_in_the_openapi_document_with_a_summary_and_its_scope(
    client: Client,
) -> None:
    paths = json.loads(client.get("/api/v1/openapi.json").content)["paths"]
    expected = {
        ("/api/v1/teams/", "get"): READ,
        ("/api/v1/teams/", "post"): WRITE,
        ("/api/v1/teams/{slug}", "get"): READ,
        ("/api/v1/teams/{slug}/members", "post"): WRITE,
        ("/api/v1/teams/{slug}/members/{username}/{role}", "delete"): WRITE,
    }
    for (path, method), scope in expected.items():
        operation = paths[path][method]
        assert operation["summary"][0].isupper(), (path, method)
        assert f"Scope: ``{scope}``" in operation["description"], (path, method)


# The client library and its command ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_client_and_its_command_manage_teams(
    live_server: LiveServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    admin = user_with_role(Role.ADMINS, username="ada")
    user_with_role(None, username="pat")
    team_make("payables")
    token = make_token(admin, BOTH)

    with PandawebClient(live_server.url, token) as client:
        made = client.team_create("Accounts payable", slug="ap")
        added = client.team_member_add("ap", "pat", "Reviewers")
        with pytest.raises(ApiError) as refused:
            client.team_member_add("ap", "nobody", "Reviewers")
        listed = client.teams()
        removed = client.team_member_remove("ap", "pat", "Reviewers")
        read = client.team("ap")

    assert (made.slug, made.name, made.members) == ("ap", "Accounts payable", [])
    assert added.members == [{"username": "pat", "roles": ["Reviewers"]}]
    assert refused.value.status == 422
    assert refused.value.errors == [
        {"field": "username", "message": "nobody here is called 'nobody'"}
    ]
    assert {"ap", "payables"} <= {t.slug for t in listed}
    assert removed.members == read.members == []

    monkeypatch.setenv("PANDAWEB_TOKEN", token)
    url = ["--url", live_server.url]

    def said(*args: str, exit_code: int = 0) -> tuple[list[str], str]:
        assert pandaweb_command([*url, *args]) == exit_code
        out, err = capsys.readouterr()
        return out.splitlines(), err

    assert said("teams", "add", "ap", "pat", "Operators")[0] == ["pat is Operators in ap"]
    assert said("teams", "show", "ap")[0] == [
        "ap: Accounts payable (people: 1, workflows: 0)",
        "  pat: Operators",
    ]
    assert "ap: Accounts payable (people: 1, workflows: 0)" in said("teams", "list")[0]
    assert said("teams", "remove", "ap", "pat", "Operators")[0] == ["pat is not Operators in ap"]
    assert said("teams", "create", "Sales", "--slug", "sales")[0] == ["made team sales (Sales)"]
    _, refused_words = said("teams", "add", "sales", "pat", "Kings", exit_code=1)
    assert "role: 'Kings' is not a team role" in refused_words
    assert not Membership.objects.filter(team__slug="ap").exists()
    assert Team.objects.filter(slug="sales").exists()
