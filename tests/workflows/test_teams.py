"""Teams on the workflows side: who sees, changes and makes which team's workflows and
credentials, and that a workflow never uses another team's credential."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User
from django.test import Client

from pandaweb.audit.models import AuditEvent
from pandaweb.core.models import DEFAULT_TEAM_SLUG, Membership, Team
from pandaweb.core.roles import Role
from sessions.services.credentials import CredentialRefused, credentials_open
from tests.factories import user_with_role
from workflows import selectors, services
from workflows.models import Credential, Workflow

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin() -> User:
    return user_with_role(Role.ADMINS, username="ada")


def document(slug: str, *, credentials: list[str] | None = None) -> str:
    return yaml.safe_dump(
        {
            "pandaweb": 1, "name": slug.title(), "slug": slug,
            "settings": {"allowed_hosts": ["127.0.0.1:8001"], "credentials": credentials or []},
            "steps": [{"id": "open", "type": "goto", "url": "http://127.0.0.1:8001/"}],
        }
    )  # fmt: skip


def credential(user: User, name: str, **kwargs: Any) -> Credential:
    return services.credential_create(
        user=user, name=name, kind="api_token", description="", values={"token": "s3cret"}, **kwargs
    )


@pytest.fixture
def invoices(ours: User) -> Workflow:
    workflow = services.workflow_import(user=ours, text=document("invoices"))
    services.workflow_publish(workflow_id=workflow.pk, user=ours, message="v1")
    return workflow


def client_of(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_new_workflow_joins_its_authors_only_team(invoices: Workflow, payables: Team) -> None:
    assert invoices.team_id == payables.pk


def test_lists_and_lookups_narrow_to_the_persons_teams(
    invoices: Workflow, ours: User, theirs: User, admin: User
) -> None:
    services.workflow_import(user=theirs, text=document("orders"))

    assert [w.slug for w in selectors.workflow_list(user=ours)] == ["invoices"]
    assert [w.slug for w in selectors.workflow_list(user=theirs)] == ["orders"]
    assert {w.slug for w in selectors.workflow_list(user=admin)} == {"invoices", "orders"}
    assert selectors.workflow_get("invoices", user=admin) == invoices


@pytest.mark.parametrize(
    "path",
    ["", "settings/", "versions/1/", "versions/1/export.yaml", "diff/", "steps/add/?type=click"],
)
def test_another_teams_workflow_is_not_found_on_any_page(
    invoices: Workflow, ours: User, theirs: User, admin: User, path: str
) -> None:
    url = f"/workflows/invoices/{path}"

    assert client_of(ours).get(url).status_code == 200
    assert client_of(admin).get(url).status_code == 200
    assert client_of(theirs).get(url).status_code == 404


def test_the_index_lists_only_the_persons_teams_workflows(invoices: Workflow, theirs: User) -> None:
    page = client_of(theirs).get("/workflows/")

    assert page.status_code == 200
    assert "invoices" not in page.content.decode()


def test_another_teams_author_cannot_change_a_workflow_through_the_services(
    invoices: Workflow, theirs: User
) -> None:
    events = AuditEvent.objects.count()

    with pytest.raises(services.WorkflowError, match="may not change Payables's workflows"):
        services.step_save(
            workflow_id=invoices.pk,
            user=theirs,
            data={"id": "more", "type": "goto", "url": "http://127.0.0.1:8001/x"},
        )
    with pytest.raises(services.WorkflowError, match="Payables's workflows"):
        services.workflow_set_archived(workflow_id=invoices.pk, user=theirs, archived=True)
    with pytest.raises(services.ImportRefused):
        services.workflow_import(user=theirs, text=document("invoices").replace("Invoices", "X"))

    invoices.refresh_from_db()
    assert not invoices.archived
    assert invoices.name == "Invoices"
    assert not invoices.versions.filter(status="draft").exists()
    assert AuditEvent.objects.count() == events


def test_a_reviewer_of_the_team_who_authors_elsewhere_reads_but_may_not_edit(
    invoices: Workflow, payables: Team, theirs: User
) -> None:
    Membership.objects.create(team=payables, user=theirs, role=Role.REVIEWERS.value)
    client = client_of(theirs)

    assert client.get("/workflows/invoices/").status_code == 200
    assert "Add a step" not in client.get("/workflows/invoices/").content.decode()
    assert client.get("/workflows/invoices/settings/").status_code == 403
    assert client.post("/workflows/invoices/archive/", {"archived": "1"}).status_code == 403
    invoices.refresh_from_db()
    assert not invoices.archived


def test_someone_in_several_teams_says_which_team_a_new_workflow_joins(
    payables: Team, procurement: Team, ours: User
) -> None:
    Membership.objects.create(team=procurement, user=ours, role=Role.OPERATORS.value)

    with pytest.raises(services.WorkflowError, match="say which team: payables or procurement"):
        services.workflow_import(user=ours, text=document("orders"))
    with pytest.raises(services.WorkflowError, match="say which team"):
        services.workflow_create(user=ours, name="Orders", slug="orders")
    made = services.workflow_create(user=ours, name="Orders", slug="orders", team="procurement")

    assert made.team_id == procurement.pk
    assert Workflow.objects.filter(slug="orders").count() == 1


def test_nobody_makes_a_workflow_in_a_team_they_do_not_author_in(
    procurement: Team, ours: User
) -> None:
    with pytest.raises(services.WorkflowError, match="may not make workflows or credentials in"):
        services.workflow_create(user=ours, name="Orders", slug="orders", team="procurement")

    assert not Workflow.objects.filter(slug="orders").exists()


def test_a_global_author_without_a_team_given_makes_it_in_the_default_team(admin: User) -> None:
    made = services.workflow_create(user=admin, name="Orders", slug="orders")

    assert made.team.slug == DEFAULT_TEAM_SLUG


def test_a_new_draft_of_an_existing_workflow_keeps_its_team(
    invoices: Workflow, payables: Team, admin: User
) -> None:
    services.workflow_import(user=admin, text=document("invoices").replace("Invoices", "Bills"))
    with pytest.raises(services.WorkflowError, match="is Payables's workflow, not procurement's"):
        services.workflow_import(
            user=admin, text=document("invoices").replace("Invoices", "B"), team="procurement"
        )

    invoices.refresh_from_db()
    assert invoices.team_id == payables.pk
    assert invoices.name == "Bills"


def test_the_create_form_offers_a_team_only_to_someone_in_several(
    procurement: Team, ours: User
) -> None:
    assert 'name="team"' not in client_of(ours).get("/workflows/new/").content.decode()

    Membership.objects.create(team=procurement, user=ours, role=Role.OPERATORS.value)
    client = client_of(ours)
    assert 'name="team"' in client.get("/workflows/new/").content.decode()
    assert 'name="team"' in client.get("/workflows/credentials/new/").content.decode()
    response = client.post("/workflows/new/", {"name": "Orders", "team": "procurement",
                                               "reviewer_group": _reviewers_pk()})  # fmt: skip

    assert response.status_code == 302
    assert Workflow.objects.get(slug="orders").team_id == procurement.pk


def _reviewers_pk() -> int:
    from django.contrib.auth.models import Group

    return Group.objects.get(name="Reviewers").pk


# Credentials --------------------------------------------------------------------------------------


def test_a_credential_joins_its_authors_team_and_only_that_team_sees_it(
    payables: Team, ours: User, theirs: User, admin: User
) -> None:
    ledger = credential(ours, "ledger")

    assert ledger.team_id == payables.pk
    assert [c.name for c in selectors.credential_list(user=ours)] == ["ledger"]
    assert list(selectors.credential_list(user=theirs)) == []
    assert [c.name for c in selectors.credential_list(user=admin)] == ["ledger"]
    assert client_of(theirs).get(f"/workflows/credentials/{ledger.pk}/replace/").status_code == 404
    assert "ledger" not in client_of(theirs).get("/workflows/credentials/").content.decode()
    with pytest.raises(services.WorkflowError, match="Payables's credentials"):
        services.credential_replace_value(
            credential_id=ledger.pk, user=theirs, values={"token": "other"}
        )


def test_a_workflow_file_naming_another_teams_credential_is_answered_as_naming_a_missing_one(
    ours: User, theirs: User
) -> None:
    credential(theirs, "supplier-portal")

    answers = []
    for name in ("supplier-portal", "no-such-portal"):
        with pytest.raises(services.ImportRefused) as refused:
            services.workflow_import(user=ours, text=document("invoices", credentials=[name]))
        answers.append([p.message.replace(name, "NAME") for p in refused.value.problems])

    assert answers[0] == answers[1] == ["there is no credential named 'NAME'"]
    assert not Workflow.objects.filter(slug="invoices").exists()


def test_a_file_with_another_teams_slug_is_answered_as_a_taken_slug_and_changes_nothing(
    ours: User, theirs: User
) -> None:
    orders = services.workflow_create(user=theirs, name="Orders", slug="orders")
    versions = orders.versions.count()

    with pytest.raises(services.ImportRefused) as refused:
        services.workflow_import(user=ours, text=document("orders").replace("Orders", "Mine"))
    with pytest.raises(services.WorkflowError) as taken:
        services.workflow_create(user=ours, name="Orders", slug="orders")

    assert [p.message for p in refused.value.problems] == taken.value.field_errors["slug"]
    orders.refresh_from_db()
    assert orders.name == "Orders"
    assert orders.versions.count() == versions


def test_publishing_refuses_a_credential_that_moved_to_another_team(
    ours: User, procurement: Team
) -> None:
    ledger = credential(ours, "ledger")
    workflow = services.workflow_import(
        user=ours, text=document("invoices", credentials=["ledger"])
    )
    Credential.objects.filter(pk=ledger.pk).update(team=procurement)

    with pytest.raises(services.PublishRefused) as refused:
        services.workflow_publish(workflow_id=workflow.pk, user=ours, message="v1")

    assert any("there is no credential named 'ledger'" in p for p in refused.value.problems)
    assert not workflow.versions.filter(status="published").exists()


def test_the_settings_refuse_another_teams_credential(
    invoices: Workflow, ours: User, theirs: User
) -> None:
    foreign = credential(theirs, "supplier-portal")

    with pytest.raises(services.WorkflowError) as refused:
        services.workflow_update_settings(
            workflow_id=invoices.pk, user=ours, name=invoices.name, description="",
            reviewer_group=invoices.reviewer_group, allowed_hosts=["127.0.0.1:8001"],
            step_budget=50, run_ttl_minutes=15, approval_quorum=1, approval_expiry_minutes=60,
            author_may_approve=False, credentials=[foreign],
        )  # fmt: skip

    assert refused.value.field_errors["credentials"] == [
        "there is no credential named 'supplier-portal'"
    ]
    assert list(invoices.credentials.all()) == []


def test_secrets_are_never_opened_for_another_teams_workflow(
    ours: User, payables: Team, procurement: Team
) -> None:
    credential(ours, "ledger")
    used = AuditEvent.objects.filter(action="credential.used")

    with pytest.raises(CredentialRefused, match="'ledger' belongs to Payables"):
        credentials_open(["ledger"], team_id=procurement.pk, run_id=None)
    assert not used.exists()

    assert credentials_open(["ledger"], team_id=payables.pk, run_id=None) == {
        "ledger": {"token": "s3cret"}
    }
    assert used.count() == 1


def test_another_teams_author_opens_no_scratch_session_on_a_workflow(
    invoices: Workflow, theirs: User
) -> None:
    from sessions.models import ScratchSession
    from sessions.services.scratch import ScratchError, scratch_open

    with pytest.raises(ScratchError, match="Payables's workflows"):
        scratch_open(workflow_id=invoices.pk, user=theirs)

    assert not ScratchSession.objects.exists()


def test_another_teams_schedules_are_not_found_nor_made_nor_paused(
    invoices: Workflow, ours: User, theirs: User, admin: User
) -> None:
    from pandaweb.schedules import services as schedules
    from pandaweb.schedules.models import Schedule

    spec = schedules.ScheduleSpec(
        name="Daily", cron="0 6 * * *", timezone="UTC", inputs={}, overlap="skip", missed="skip"
    )
    schedule = schedules.schedule_create(workflow_id=invoices.pk, user=ours, spec=spec)

    assert client_of(ours).get(f"/schedules/{schedule.pk}/").status_code == 200
    assert client_of(admin).get(f"/schedules/{schedule.pk}/").status_code == 200
    assert client_of(theirs).get(f"/schedules/{schedule.pk}/").status_code == 404
    assert client_of(theirs).get("/schedules/new/invoices/").status_code == 404
    assert (
        client_of(theirs).post(f"/schedules/{schedule.pk}/pause/", {"paused": "1"}).status_code
        == 404
    )
    with pytest.raises(schedules.ScheduleError, match="may not schedule runs of Payables's"):
        schedules.schedule_create(workflow_id=invoices.pk, user=theirs, spec=spec)
    with pytest.raises(schedules.ScheduleError, match="Payables's"):
        schedules.schedule_set_paused(schedule_id=schedule.pk, user=theirs, paused=True)

    assert Schedule.objects.get().paused is False


def test_the_list_names_each_workflows_team_for_someone_who_sees_several(
    invoices: Workflow, procurement: Team, ours: User
) -> None:
    alone = client_of(ours).get("/workflows/").content.decode()
    Membership.objects.create(team=procurement, user=ours, role=Role.REVIEWERS.value)
    several = client_of(ours).get("/workflows/").content.decode()

    assert "<th>Team</th>" not in alone
    assert "<th>Team</th>" in several
    assert "<td>Payables</td>" in several
