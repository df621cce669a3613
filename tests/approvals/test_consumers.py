from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from approvals.events import publish_pending_changed
from approvals.models import Question
from pandaweb.asgi import application
from pandaweb.core.roles import Role
from sessions.models import Run
from tests.factories import ApprovalRequestFactory, user_with_role, waiting_run

pytestmark = pytest.mark.django_db(transaction=True)


def cookie_of(user: User) -> str:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


@database_sync_to_async
def session_cookie_for(role: Role | None) -> str:
    return cookie_of(user_with_role(role))


def communicator(
    cookie: str | None, origin: str = "http://127.0.0.1:8000"
) -> WebsocketCommunicator:
    headers: list[tuple[bytes, bytes]] = [(b"origin", origin.encode()), (b"host", b"127.0.0.1")]
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    return WebsocketCommunicator(application, "/ws/nav/", headers=headers)


async def handshake(socket: WebsocketCommunicator) -> bool:
    connected, _ = await socket.connect(timeout=10)
    # Ends the consumer and its channel-layer receive while this test's loop runs: a Redis
    # receive left to the loop's shutdown can hang it.
    await socket.disconnect()
    return connected


async def test_it_refuses_an_anonymous_handshake() -> None:
    connected = await handshake(communicator(None))

    assert connected is False


async def test_it_refuses_a_foreign_origin_even_with_a_session() -> None:
    cookie = await session_cookie_for(Role.REVIEWERS)

    connected = await handshake(communicator(cookie, origin="http://evil.example.test"))

    assert connected is False


async def test_it_refuses_a_person_without_a_role() -> None:
    cookie = await session_cookie_for(None)

    connected = await handshake(communicator(cookie))

    assert connected is False


async def test_a_reviewer_gets_the_badge_and_its_updates() -> None:
    cookie = await session_cookie_for(Role.REVIEWERS)
    socket = communicator(cookie)
    connected, _ = await socket.connect(timeout=10)
    assert connected

    first = await socket.receive_from(timeout=10)
    assert 'id="needs-badge"' in first
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
    await socket.disconnect()


async def test_the_badge_counts_the_questions_asked_of_each_person_live() -> None:
    asked, colleague = await database_sync_to_async(asked_and_colleague)()
    mine = communicator(await database_sync_to_async(cookie_of)(asked))
    theirs = communicator(await database_sync_to_async(cookie_of)(colleague))
    assert (await mine.connect(timeout=10))[0]
    assert (await theirs.connect(timeout=10))[0]
    assert 'data-questions="0"' in await mine.receive_from(timeout=10)
    assert 'data-questions="0"' in await theirs.receive_from(timeout=10)

    await database_sync_to_async(ask_and_publish)(asked)

    # An operator does not see the queue: the badge counts what the runs ask them.
    badge = await mine.receive_from(timeout=10)
    assert 'data-questions="1"' in badge
    assert 'data-approvals="0"' in badge
    assert ">1</span>" in badge
    # Nothing was asked of the colleague, who may not answer it.
    assert ">0</span>" in await theirs.receive_from(timeout=10)
    await mine.disconnect()
    await theirs.disconnect()


async def test_a_reviewers_badge_adds_their_questions_to_the_pending_approvals() -> None:
    reviewer = await database_sync_to_async(user_with_role)(Role.REVIEWERS, username="tara")
    socket = communicator(await database_sync_to_async(cookie_of)(reviewer))
    assert (await socket.connect(timeout=10))[0]
    await socket.receive_from(timeout=10)

    await database_sync_to_async(approval_and_question_for_reviewers)()

    badge = await socket.receive_from(timeout=10)
    assert 'data-approvals="1"' in badge
    assert 'data-questions="1"' in badge
    assert ">2</span>" in badge
    await socket.disconnect()


def asked_and_colleague() -> tuple[User, User]:
    run = waiting_run()
    return run.launched_by, user_with_role(Role.OPERATORS, username="otto")


def ask(run: Run, answered_by: str = "launcher") -> Question:
    Run.objects.filter(pk=run.pk).update(status=Run.Status.AWAITING_ANSWER)
    return Question.objects.create(
        run=run, step_index=0, step_id="ask-code", text="Type the SMS code", kind="code",
        save_as="sms_code", answered_by=answered_by, timeout_minutes=10,
        expires_at=timezone.now() + timedelta(minutes=10),
    )  # fmt: skip


def ask_and_publish(launcher: User) -> None:
    ask(Run.objects.filter(launched_by=launcher).get())
    publish_pending_changed()


def approval_and_question_for_reviewers() -> None:
    ApprovalRequestFactory()
    ask(waiting_run(), answered_by=Role.REVIEWERS.value)
    publish_pending_changed()


def create_two_pending_and_publish() -> None:
    ApprovalRequestFactory.create_batch(2)
    ApprovalRequestFactory(status="approved")
    publish_pending_changed()


def strip_roles_and_publish() -> None:
    for user in User.objects.all():
        user.groups.clear()
    publish_pending_changed()
