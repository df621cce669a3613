"""The isolation matrix's websockets: a team-A person never hears of a team-B run.

A socket addressed by B's run must be refused exactly as one addressed by a run that does not
exist; the sockets that fan out changes to everyone (the runs list, home counts, the navigation
badge) must send a team-A person nothing when B's run changes. ``test_every_socket_has_a_rule``
fails for a socket route added without a rule here.
"""

from __future__ import annotations

import re

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.test import Client

from approvals.events import PENDING_GROUP
from pandaweb.asgi import application
from pandaweb.core.roles import Role
from pandaweb.routing import websocket_urlpatterns
from sessions.events import RUNS_GROUP
from sessions.models import Run
from tests.factories import ApprovalRequestFactory, member_of, team_make, waiting_run

pytestmark = pytest.mark.django_db(transaction=True)

MISSING_RUN = 987654
# A run's own sockets: B's run must be refused as a missing one is.
BY_RUN = ("/ws/runs/{run}/?after=0", "/ws/runs/{run}/queue/", "/ws/runs/{run}/live/")
# Sockets every signed-in person may open: B's run changing must send a team-A person nothing.
FAN_OUT = ("/ws/runs/?newer_than=0", "/ws/home/", "/ws/nav/")
TEAM_ROLES = (Role.OPERATORS, Role.REVIEWERS, Role.COMPLIANCE)


def test_every_socket_has_a_rule() -> None:
    routes = {"/" + str(pattern.pattern) for pattern in websocket_urlpatterns}
    ruled = {path.split("?")[0].replace("{run}", "<int:run_id>") for path in BY_RUN + FAN_OUT}

    assert routes - ruled == set(), "socket routes with no team rule in test_isolation_sockets"


@database_sync_to_async
def world(role: Role) -> tuple[str, int]:
    run = waiting_run()
    Run.objects.filter(pk=run.pk).update(team=team_make("team-b"))
    ApprovalRequestFactory.create(run=run)  # for the badge and the counts to have one to count
    person = member_of(team_make("team-a"), role, username=f"a-{role.value.lower()}")
    client = Client()
    client.force_login(person)
    return f"sessionid={client.cookies['sessionid'].value}", run.pk


def socket(path: str, cookie: str) -> WebsocketCommunicator:
    headers = [(b"origin", b"http://127.0.0.1:8000"), (b"host", b"127.0.0.1"),
               (b"cookie", cookie.encode())]  # fmt: skip
    return WebsocketCommunicator(application, path, headers=headers)


async def outcome(path: str, cookie: str) -> str:
    """What a client is told: refused, or accepted and then whatever it is sent first."""
    communicator = socket(path, cookie)
    connected, _ = await communicator.connect(timeout=10)
    if not connected:
        return "refused"
    try:
        if await communicator.receive_nothing(timeout=0.5):
            return "accepted, silent"
        output = await communicator.receive_output(timeout=1)
        return f"accepted, sent {output.get('type')}"
    finally:
        await communicator.disconnect()


@pytest.mark.parametrize("role", TEAM_ROLES, ids=[role.value for role in TEAM_ROLES])
async def test_a_team_b_runs_sockets_answer_team_a_as_a_missing_runs_do(role: Role) -> None:
    cookie, run_id = await world(role)

    rows = []
    for path in BY_RUN:
        theirs = await outcome(path.format(run=run_id), cookie)
        missing = await outcome(path.format(run=MISSING_RUN), cookie)
        rows.append((path, theirs, missing))

    assert [row for row in rows if row[1] != row[2] or row[1] != "refused"] == []


def news_of(run_id: int, sent: str) -> bool:
    """Whether a message tells of team B's run: a row or link of it, or a count above zero (team
    A has no run, approval or question at all, so every count it may see is zero)."""
    return f"/runs/{run_id}/" in sent or re.search(r"<strong>[1-9]\d*</strong>", sent) is not None


@pytest.mark.parametrize("role", TEAM_ROLES, ids=[role.value for role in TEAM_ROLES])
async def test_a_team_b_run_changing_sends_team_a_nothing(role: Role) -> None:
    cookie, run_id = await world(role)
    leaks = {}
    for path in FAN_OUT:
        communicator = socket(path, cookie)
        connected, _ = await communicator.connect(timeout=10)
        if not connected:
            continue
        message = {"type": "runs.changed", "run_id": run_id}
        await get_channel_layer().group_send(RUNS_GROUP, message)
        await get_channel_layer().group_send(PENDING_GROUP, {"type": "approvals.pending_changed"})
        while not await communicator.receive_nothing(timeout=1):
            sent = await communicator.receive_from(timeout=1)
            if news_of(run_id, sent):
                leaks[path] = sent
        await communicator.disconnect()

    assert leaks == {}
