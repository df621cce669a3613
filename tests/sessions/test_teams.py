"""Runs per team on the dashboard: another team's run is "no such run" on every page and socket;
lists, counts and exports hold only the person's teams; admins see every team."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from pandaweb.asgi import application
from pandaweb.core.models import Team
from pandaweb.core.roles import Role
from sessions import console, console_services
from sessions.events import RUNS_GROUP, RunChanged
from sessions.layer import layer_send
from sessions.models import Run
from sessions.services import RunError
from tests.factories import member_of, team_make, user_with_role, waiting_run


def in_team(team: Team) -> Run:
    run = waiting_run()
    Run.objects.filter(pk=run.pk).update(team=team)
    run.refresh_from_db()
    return run


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_another_teams_run_pages_are_not_found() -> None:
    payables, procurement = team_make("payables"), team_make("procurement")
    run = in_team(payables)
    people = {
        "ours": member_of(payables, Role.OPERATORS),
        "stranger": member_of(procurement, Role.OPERATORS),
        "admin": user_with_role(Role.ADMINS),
    }
    paths = [f"/runs/{run.pk}/", f"/runs/{run.pk}/again/", f"/runs/{run.pk}/files/nothing.png"]

    seen = {
        name: [client_for(person).get(path).status_code for path in paths]
        for name, person in people.items()
    }

    assert seen == {"ours": [200, 200, 404], "stranger": [404, 404, 404], "admin": [200, 200, 404]}
    cancel = client_for(people["stranger"]).post(f"/runs/{run.pk}/cancel/")
    assert cancel.status_code == 404
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL


@pytest.mark.django_db
def test_lists_counts_and_exports_hold_only_the_persons_teams() -> None:
    payables, procurement = team_make("payables"), team_make("procurement")
    ours, theirs = in_team(payables), in_team(procurement)
    person = member_of(payables, Role.OPERATORS)
    admin = user_with_role(Role.ADMINS)
    everything = console.RunFilter.from_params({})

    assert [r.pk for r in console.run_page(everything, user=person).runs] == [ours.pk]
    assert console.needs_counts(person)["active"] == 1
    assert console.needs_counts(admin)["active"] == 2
    assert console.run_row(theirs.pk, user=person) is None
    assert not console.run_matches(everything, theirs.pk, user=person)
    exported = "".join(console.run_csv_rows(everything, user=person)).splitlines()
    assert [line.split(",")[0] for line in exported[1:]] == [str(ours.pk)]
    assert {r.pk for r in console.run_page(everything, user=admin).runs} == {ours.pk, theirs.pk}
    body = client_for(person).get("/runs/").content.decode()
    assert f'id="run-{ours.pk}"' in body
    assert f'id="run-{theirs.pk}"' not in body


@pytest.mark.django_db
def test_a_rerun_needs_launch_rights_in_the_runs_team() -> None:
    payables, procurement = team_make("payables"), team_make("procurement")
    run = in_team(payables)
    stranger = member_of(procurement, Role.OPERATORS)

    with pytest.raises(RunError, match="another team's workflows"):
        console_services.run_rerun(run_id=run.pk, user=stranger, raw_inputs={})

    assert not Run.objects.filter(rerun_of=run).exists()


def socket(path: str, cookie: str) -> WebsocketCommunicator:
    headers = [
        (b"origin", b"http://127.0.0.1:8000"),
        (b"host", b"127.0.0.1"),
        (b"cookie", cookie.encode()),
    ]
    return WebsocketCommunicator(application, path, headers=headers)


@database_sync_to_async
def cookie_for(user: User) -> str:
    return f"sessionid={client_for(user).cookies['sessionid'].value}"


@pytest.mark.django_db(transaction=True)
async def test_run_sockets_refuse_another_teams_run() -> None:
    def arrange() -> tuple[Run, User, User, User]:
        payables, procurement = team_make("payables"), team_make("procurement")
        return (
            in_team(payables),
            member_of(payables, Role.REVIEWERS),
            member_of(procurement, Role.REVIEWERS),
            user_with_role(Role.ADMINS),
        )

    run, ours, stranger, admin = await database_sync_to_async(arrange)()
    accepted = {}
    for name, person in (("ours", ours), ("stranger", stranger), ("admin", admin)):
        for kind in ("", "live/"):
            communicator = socket(f"/ws/runs/{run.pk}/{kind}", await cookie_for(person))
            connected, _ = await communicator.connect(timeout=10)
            accepted[(name, kind)] = connected
            await communicator.disconnect()

    assert accepted == {
        ("ours", ""): True,
        ("ours", "live/"): True,
        ("stranger", ""): False,
        ("stranger", "live/"): False,
        ("admin", ""): True,
        ("admin", "live/"): True,
    }


@pytest.mark.django_db(transaction=True)
async def test_the_runs_list_socket_sends_no_row_of_another_teams_run() -> None:
    def arrange() -> tuple[Run, Run, User]:
        payables, procurement = team_make("payables"), team_make("procurement")
        return in_team(payables), in_team(procurement), member_of(payables, Role.OPERATORS)

    ours, theirs, person = await database_sync_to_async(arrange)()
    communicator = socket("/ws/runs/", await cookie_for(person))
    connected, _ = await communicator.connect(timeout=10)
    assert connected

    for run in (theirs, ours):
        changed: RunChanged = {"type": "runs.changed", "run_id": run.pk}
        await layer_send(RUNS_GROUP, dict(changed))
    row = await communicator.receive_from(timeout=10)
    assert await communicator.receive_nothing(timeout=0.3)
    await communicator.disconnect()

    assert f'id="run-{ours.pk}"' in row
