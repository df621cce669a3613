from __future__ import annotations

import json
from typing import Any

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
        refused = socket(path, cookie)
        connected, _ = await refused.connect(timeout=10)
        # Ends the consumer and its channel-layer receive while this test's loop runs.
        await refused.disconnect()
        assert connected is False, path


async def test_a_client_catching_up_gets_the_header_once_with_the_last_event(
    operator: User, demo_workflow: Workflow
) -> None:
    run = await launch_and_cancel(operator, demo_workflow)
    late = socket(f"/ws/runs/{run.pk}/?after=0", await cookie_for(operator))
    assert (await late.connect(timeout=10))[0]
    first = json.loads(await late.receive_from(timeout=10))
    second = json.loads(await late.receive_from(timeout=10))
    await late.disconnect()

    def targets(message: dict[str, Any]) -> list[str]:
        return [f["target"] for f in message["fragments"]]

    assert "#run-header" not in targets(first)
    assert targets(second)[:2] == ["#run-header", "#run-side"]


async def test_a_viewer_who_loses_the_right_to_see_runs_is_disconnected_at_the_next_event(
    operator: User, demo_workflow: Workflow
) -> None:
    reviewer = await database_sync_to_async(user_with_role)(Role.REVIEWERS)
    run = await database_sync_to_async(services.run_launch)(
        workflow_id=demo_workflow.pk, user=operator, raw_inputs=INPUTS
    )
    watching = socket(f"/ws/runs/{run.pk}/?after=0", await cookie_for(reviewer))
    assert (await watching.connect(timeout=10))[0]
    json.loads(await watching.receive_from(timeout=10))  # the launch

    await database_sync_to_async(reviewer.groups.clear)()
    await database_sync_to_async(services.run_cancel)(run_id=run.pk, user=operator)

    assert (await watching.receive_output(timeout=10))["type"] == "websocket.close"


@pytest.mark.django_db(transaction=True)
def test_viewers_alike_share_one_render_of_an_event_and_others_get_their_own(
    operator: User, demo_workflow: Workflow
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from sessions.rendering import Viewer, messages_for
    from sessions.selectors import run_events_after

    run = launch_and_cancel.func(operator, demo_workflow)
    events = run_events_after(run.pk, 0)
    reviewers = [Viewer.of(user_with_role(Role.REVIEWERS)) for _ in range(2)]
    launcher = Viewer.of(operator)

    def render(viewer: Viewer) -> tuple[int, list[dict[str, object]]]:
        with CaptureQueriesContext(connection) as queries:
            messages = messages_for(run.pk, events, viewer)
        return len(queries), messages

    first_cost, first = render(reviewers[0])
    alike_cost, alike = render(reviewers[1])
    launcher_cost, _ = render(launcher)

    assert alike == first
    assert alike_cost == 1 < first_cost  # the run; the first reviewer rendered every fragment
    assert launcher_cost > alike_cost  # the launcher's header is not a reviewer's
