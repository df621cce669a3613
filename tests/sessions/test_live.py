from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from pandaweb.asgi import application
from pandaweb.core.roles import Role
from sessions import services
from sessions.models import Run
from tests.factories import user_with_role
from workflows.models import Workflow

pytestmark = pytest.mark.django_db(transaction=True)

INPUTS = {"invoice": "INV-1001", "amount": "1250.00"}


@database_sync_to_async
def cookie_for(user: User) -> str:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


def socket(path: str, cookie: str | None) -> WebsocketCommunicator:
    headers = [(b"origin", b"http://127.0.0.1:8000"), (b"host", b"127.0.0.1")]
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    return WebsocketCommunicator(application, path, headers=headers)


@database_sync_to_async
def launch_and_cancel(operator: User, workflow: Workflow) -> Run:
    run = services.run_launch(workflow_id=workflow.pk, user=operator, raw_inputs=INPUTS)
    services.run_cancel(run_id=run.pk, user=operator)
    return run


async def test_a_late_client_replays_every_event_from_the_database(
    operator: User, demo_workflow: Workflow
) -> None:
    run = await launch_and_cancel(operator, demo_workflow)
    cookie = await cookie_for(await database_sync_to_async(user_with_role)(Role.REVIEWERS))

    late = socket(f"/ws/runs/{run.pk}/?after=0", cookie)
    connected, _ = await late.connect(timeout=10)
    assert connected
    first = json.loads(await late.receive_from(timeout=10))
    second = json.loads(await late.receive_from(timeout=10))
    await late.disconnect()

    assert [first["seq"], second["seq"]] == [1, 2]
    assert second["final"] is True
    assert "Cancelled" in second["fragments"][0]["html"]


async def test_a_reconnecting_client_gets_only_what_it_missed(
    operator: User, demo_workflow: Workflow
) -> None:
    run = await launch_and_cancel(operator, demo_workflow)
    cookie = await cookie_for(operator)

    again = socket(f"/ws/runs/{run.pk}/?after=1", cookie)
    connected, _ = await again.connect(timeout=10)
    assert connected
    message = json.loads(await again.receive_from(timeout=10))
    assert message["seq"] == 2
    assert await again.receive_nothing(timeout=0.3)
    await again.disconnect()


async def test_run_sockets_refuse_strangers(operator: User, demo_workflow: Workflow) -> None:
    run = await launch_and_cancel(operator, demo_workflow)
    no_role = await cookie_for(await database_sync_to_async(user_with_role)(None))

    operator_cookie = await cookie_for(operator)
    attempts = [
        (f"/ws/runs/{run.pk}/", None),
        (f"/ws/runs/{run.pk}/", no_role),
        ("/ws/runs/", no_role),
        ("/ws/runs/999999/", operator_cookie),
    ]
    for path, cookie in attempts:
        connected, _ = await socket(path, cookie).connect(timeout=10)
        assert connected is False, path
