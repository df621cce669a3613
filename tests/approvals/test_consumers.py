from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from approvals.events import publish_pending_changed
from pandaweb.asgi import application
from pandaweb.core.roles import Role
from tests.factories import ApprovalRequestFactory, user_with_role

pytestmark = pytest.mark.django_db(transaction=True)


@database_sync_to_async
def session_cookie_for(role: Role | None) -> str:
    user = user_with_role(role)
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


def communicator(
    cookie: str | None, origin: str = "http://127.0.0.1:8000"
) -> WebsocketCommunicator:
    headers: list[tuple[bytes, bytes]] = [(b"origin", origin.encode()), (b"host", b"127.0.0.1")]
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    return WebsocketCommunicator(application, "/ws/nav/", headers=headers)


async def test_it_refuses_an_anonymous_handshake() -> None:
    connected, _ = await communicator(None).connect(timeout=10)

    assert connected is False


async def test_it_refuses_a_foreign_origin_even_with_a_session() -> None:
    cookie = await session_cookie_for(Role.REVIEWERS)

    connected, _ = await communicator(cookie, origin="http://evil.example.test").connect(timeout=10)

    assert connected is False


async def test_it_refuses_a_role_that_may_not_see_approvals() -> None:
    cookie = await session_cookie_for(Role.OPERATORS)

    connected, _ = await communicator(cookie).connect(timeout=10)

    assert connected is False


async def test_a_reviewer_gets_the_badge_and_its_updates() -> None:
    cookie = await session_cookie_for(Role.REVIEWERS)
    socket = communicator(cookie)
    connected, _ = await socket.connect(timeout=10)
    assert connected

    first = await socket.receive_from(timeout=10)
    assert 'id="approvals-badge"' in first
    assert 'hx-swap-oob="true"' in first
    assert ">0</span>" in first

    await database_sync_to_async(create_two_pending_and_publish)()

    second = await socket.receive_from(timeout=10)
    assert ">2</span>" in second
    await socket.disconnect()


async def test_a_reviewer_who_loses_the_role_is_disconnected() -> None:
    cookie = await session_cookie_for(Role.REVIEWERS)
    socket = communicator(cookie)
    connected, _ = await socket.connect(timeout=10)
    assert connected
    await socket.receive_from(timeout=10)

    await database_sync_to_async(strip_roles_and_publish)()

    output: dict[str, Any] = await socket.receive_output(timeout=10)
    assert output["type"] == "websocket.close"


def create_two_pending_and_publish() -> None:
    ApprovalRequestFactory.create_batch(2)
    ApprovalRequestFactory(status="approved")
    publish_pending_changed()


def strip_roles_and_publish() -> None:
    for user in User.objects.all():
        user.groups.clear()
    publish_pending_changed()
