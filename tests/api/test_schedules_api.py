"""Schedules over the API: the schedule page's services, rules and audit events."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User

from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from pandaweb.schedules import services
from pandaweb.schedules.models import Schedule
from tests.api.conftest import Api, make_token
from tests.api.test_api import problem
from tests.factories import user_with_role
from workflows.models import Workflow

pytestmark = pytest.mark.django_db

WEEKDAYS_IBAN = "DE97 2004 0060 0123 4567 89"  # the demo workflow's default
WEEKDAYS: dict[str, Any] = {
    "workflow": "acme-pay-invoice",
    "name": "Morning invoice",
    "cron": "0 6 * * 1-5",
    "timezone": "Europe/Berlin",
    "inputs": {"invoice": "INV-1001", "amount": "1250"},
}


@pytest.fixture
def launcher(operator: User, demo_workflow: Workflow) -> Api:
    return Api(make_token(operator))


@pytest.fixture
def colleague(db: None) -> User:
    return user_with_role(Role.OPERATORS, username="otto")


def patch(api: Api, path: str, body: dict[str, Any]) -> Any:
    return api.client.patch(
        f"/api/v1{path}",
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {api.token}"},
    )


def delete(api: Api, path: str) -> Any:
    return api.client.delete(f"/api/v1{path}", headers={"Authorization": f"Bearer {api.token}"})


def test_it_makes_a_schedule_with_typed_inputs_and_says_it_in_words(
    launcher: Api, operator: User
) -> None:
    response = launcher.post("/schedules/", WEEKDAYS)

    assert response.status_code == 201, response.content
    body = response.json()
    schedule = Schedule.objects.get()
    assert body["id"] == schedule.pk
    assert body["in_words"] == "at 06:00 on weekdays (Europe/Berlin)"
    assert body["inputs"]["amount"] == "1250.00"
    assert len(body["next_times"]) == 5
    assert body["owner"] == operator.username
    assert schedule.next_fire_at is not None
    event = AuditEvent.objects.get(action="schedule.created")
    assert (event.after or {})["cron"] == "0 6 * * 1-5"
    assert event.extra["via"]["channel"] == "api"


def test_a_schedule_made_paused_launches_nothing_until_resumed(launcher: Api) -> None:
    body = launcher.post("/schedules/", {**WEEKDAYS, "paused": True}).json()

    assert body["paused"] is True
    assert body["next_times"] == []
    assert Schedule.objects.get().next_fire_at is None
    resumed = patch(launcher, f"/schedules/{body['id']}", {"paused": False})
    assert resumed.json()["paused"] is False
    assert [e.action for e in AuditEvent.objects.filter(object_type="schedule")] == [
        "schedule.created",
        "schedule.paused",
        "schedule.resumed",
    ]


def test_it_refuses_a_bad_expression_zone_and_input_by_field_in_words(launcher: Api) -> None:
    bad = {
        **WEEKDAYS,
        "cron": "0 6 * *",
        "timezone": "Mars/Olympus",
        "inputs": {"invoice": "1001", "amount": "1250"},
    }

    refused = problem(launcher.post("/schedules/", bad), 422)

    messages = {e["field"]: e["message"] for e in refused["errors"]}
    assert messages["cron"].startswith("a cron expression has five fields")
    assert messages["timezone"] == (
        "'Mars/Olympus' is not a time zone name like Europe/Berlin or UTC"
    )
    assert set(messages) == {"cron", "timezone", "inputs.invoice"}
    unknown = problem(launcher.post("/schedules/", {**WEEKDAYS, "workflow": "nope"}), 422)
    assert unknown["errors"][0]["field"] == "workflow"
    assert not Schedule.objects.exists()


def test_a_change_takes_the_fields_sent_and_makes_the_changer_the_owner(
    launcher: Api, colleague: User
) -> None:
    schedule_id = launcher.post("/schedules/", WEEKDAYS).json()["id"]
    other = Api(make_token(colleague))

    changed = patch(other, f"/schedules/{schedule_id}", {"cron": "*/30 8-17 * * 1-5"})

    assert changed.status_code == 200, changed.content
    body = changed.json()
    assert body["cron"] == "*/30 8-17 * * 1-5"
    assert body["inputs"] == {"invoice": "INV-1001", "amount": "1250.00", "iban": WEEKDAYS_IBAN}
    assert body["owner"] == "otto"
    event = AuditEvent.objects.get(action="schedule.updated")
    assert (event.before or {})["cron"] == "0 6 * * 1-5"
    assert (event.after or {})["owner"] == "otto"


def test_a_refused_change_changes_nothing(launcher: Api) -> None:
    schedule_id = launcher.post("/schedules/", WEEKDAYS).json()["id"]

    refused = problem(
        patch(launcher, f"/schedules/{schedule_id}", {"cron": "61 * * * *", "paused": True}), 422
    )
    nulls = problem(patch(launcher, f"/schedules/{schedule_id}", {"name": None}), 422)

    assert [e["field"] for e in refused["errors"]] == ["cron"]
    assert nulls["errors"] == [{"field": "name", "message": "may not be null"}]
    schedule = Schedule.objects.get()
    assert (schedule.cron, schedule.paused) == ("0 6 * * 1-5", False)
    assert not AuditEvent.objects.filter(action__in=["schedule.updated", "schedule.paused"])


def test_it_lists_reads_and_deletes_schedules(launcher: Api, operator: User) -> None:
    schedule_id = launcher.post("/schedules/", WEEKDAYS).json()["id"]
    reader = Api(make_token(user_with_role(Role.REVIEWERS, username="rory"), ["workflows:read"]))

    listed = reader.get("/schedules/", {"workflow": "acme-pay-invoice"}).json()
    other_workflow = reader.get("/schedules/", {"workflow": "another"}).json()
    read = reader.get(f"/schedules/{schedule_id}").json()
    deleted = delete(launcher, f"/schedules/{schedule_id}")

    assert [s["id"] for s in listed] == [schedule_id]
    assert other_workflow == []
    assert read["name"] == "Morning invoice"
    assert deleted.status_code == 204
    assert not Schedule.objects.exists()
    event = AuditEvent.objects.get(action="schedule.deleted")
    assert (event.before or {})["name"] == "Morning invoice"
    assert problem(reader.get(f"/schedules/{schedule_id}"), 404)


def test_changing_needs_the_write_scope_and_a_role_that_launches(
    operator: User, demo_workflow: Workflow
) -> None:
    reader = Api(make_token(operator, ["workflows:read"]))
    writer = Api(make_token(operator, ["schedules:write"]))
    schedule = services.schedule_create(
        workflow_id=demo_workflow.pk,
        user=operator,
        spec=services.ScheduleSpec(
            name="n", cron="0 6 * * *", timezone="UTC", inputs=WEEKDAYS["inputs"],
            overlap="skip", missed="run_once",
        ),
    )  # fmt: skip

    missing = problem(delete(reader, f"/schedules/{schedule.pk}"), 403)
    operator.groups.set([user_with_role(Role.REVIEWERS, username="x").groups.get()])
    beyond = problem(patch(writer, f"/schedules/{schedule.pk}", {"paused": True}), 403)

    assert missing["type"].endswith("missing-scope")
    assert beyond["type"].endswith("scope-beyond-role")
    schedule.refresh_from_db()
    assert schedule.paused is False
