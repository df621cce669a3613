"""GET /api/v1/events: the Server-Sent Events stream of runs, steps, approvals and questions."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
import yaml
from asgiref.sync import async_to_sync, sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.contrib.auth.models import User
from django.core.asgi import get_asgi_application
from django.db import transaction
from django.test import AsyncClient
from django.utils import timezone

from approvals.models import Question
from pandaweb.api import events_stream
from pandaweb.api.models import ApiToken
from pandaweb.api.scopes import Scope
from pandaweb.api.services import TokenContext, hash_secret, token_revoke
from pandaweb.core.permissions import NO_ACCESS
from pandaweb.core.roles import Role
from sessions import services
from sessions.models import Run, RunEvent
from sessions.services.records import event_append, lock_run
from tests.api.conftest import make_token
from tests.factories import member_of, team_make, user_with_role
from tests.sessions.conftest import EXAMPLE, publish
from workflows.models import Workflow

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_background_runs"),
]

INPUTS = {"invoice": "INV-1001", "amount": "12.00"}


@pytest.fixture(autouse=True)
def quick_polls_and_a_fresh_fan_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events_stream, "POLL_SECONDS", 0.02)
    # Test responses are left to the garbage collector, and SQLite hands token ids out again.
    monkeypatch.setattr(events_stream, "_fan_out", None)


def launch(user: User, workflow: Workflow) -> Run:
    return services.run_launch(workflow_id=workflow.pk, user=user, raw_inputs=INPUTS)


@pytest.fixture
def other_workflow(operator: User, demo_workflow: Workflow) -> Workflow:
    document = yaml.safe_load(EXAMPLE.read_text())
    document["slug"], document["name"] = "acme-pay-invoice-copy", "Pay an Acme invoice (copy)"
    return publish(operator, document)


def writer_step_done(run_id: int, index: int) -> int:
    """What the runner's writer does for a finished step: the event on the locked run."""
    with transaction.atomic():
        run = lock_run(run_id)
        event = event_append(run, "step", {"index": index, "status": "succeeded"})
        run.save(update_fields=["last_event_seq"])
    return event.pk


step_done = sync_to_async(writer_step_done)


async def open_stream(token: str, query: str = "", **headers: str) -> Any:
    return await AsyncClient().get(
        f"/api/v1/events{query}", headers={"Authorization": f"Bearer {token}", **headers}
    )


async def next_event(response: Any) -> dict[str, Any]:
    """The next event the stream sends (skipping its retry hint and keepalives)."""
    chunks: AsyncIterator[bytes] = response.streaming_content
    while True:
        async with asyncio.timeout(10):
            chunk = await anext(chunks)
        text = chunk.decode() if isinstance(chunk, bytes) else chunk
        fields = dict(
            line.split(": ", 1) for line in text.strip().splitlines() if not line.startswith(":")
        )
        if "id" in fields:
            return {"id": int(fields["id"]), "event": fields["event"], **json.loads(fields["data"])}


async def test_it_streams_a_step_of_a_live_run(operator: User, demo_workflow: Workflow) -> None:
    run = await sync_to_async(launch)(operator, demo_workflow)
    response = await open_stream(await sync_to_async(make_token)(operator))
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"

    event_id = await step_done(run.pk, 0)

    event = await next_event(response)
    assert event["id"] == event_id
    assert event["event"] == "step"
    assert (event["run"], event["workflow"], event["index"]) == (run.pk, "acme-pay-invoice", 0)
    await response.streaming_content.aclose()


async def test_it_resumes_after_the_last_event_id_without_loss_or_duplication(
    operator: User, demo_workflow: Workflow
) -> None:
    run = await sync_to_async(launch)(operator, demo_workflow)
    token = await sync_to_async(make_token)(operator)
    seen = [await step_done(run.pk, index) for index in range(3)]

    response = await open_stream(token, **{"Last-Event-ID": str(seen[0])})
    assert [(await next_event(response))["id"] for _ in range(2)] == seen[1:]
    later = await step_done(run.pk, 3)
    assert (await next_event(response))["id"] == later
    await response.streaming_content.aclose()

    resumed = await open_stream(token, f"?last_event_id={seen[1]}")
    assert [(await next_event(resumed))["index"] for _ in range(2)] == [2, 3]
    await resumed.streaming_content.aclose()


async def test_it_filters_by_run_and_by_workflow(
    operator: User, demo_workflow: Workflow, other_workflow: Workflow
) -> None:
    first = await sync_to_async(launch)(operator, demo_workflow)
    second = await sync_to_async(launch)(operator, demo_workflow)
    elsewhere = await sync_to_async(launch)(operator, other_workflow)
    token = await sync_to_async(make_token)(operator)
    by_run = await open_stream(token, f"?run={second.pk},{elsewhere.pk}&run=999999")
    by_workflow = await open_stream(token, "?workflow=acme-pay-invoice-copy")

    await step_done(first.pk, 0)
    await step_done(second.pk, 0)
    await step_done(elsewhere.pk, 0)

    assert (await next_event(by_run))["run"] == second.pk
    assert (await next_event(by_run))["run"] == elsewhere.pk
    assert (await next_event(by_workflow))["run"] == elsewhere.pk
    await by_run.streaming_content.aclose()
    await by_workflow.streaming_content.aclose()


async def test_it_shows_only_the_events_of_the_tokens_scopes(
    operator: User, demo_workflow: Workflow
) -> None:
    run = await sync_to_async(launch)(operator, demo_workflow)
    token = await sync_to_async(make_token)(operator, ["questions:answer"])
    response = await open_stream(token)
    await step_done(run.pk, 0)

    @sync_to_async
    def awaiting_answer() -> int:
        with transaction.atomic():
            locked = lock_run(run.pk)
            Question.objects.create(
                run=locked, expires_at=timezone.now() + timedelta(minutes=10), step_index=1,
                step_id="ask-code", text="The code from the SMS?", kind="code",
                save_as="code", answered_by="launcher", timeout_minutes=10,
            )  # fmt: skip
            event = event_append(
                locked, "status", {"from": "running", "to": "awaiting_answer", "reason": ""}
            )
            locked.save(update_fields=["last_event_seq"])
        return event.pk

    question_event = await awaiting_answer()
    event = await next_event(response)
    assert (event["id"], event["event"]) == (question_event, "question.asked")
    assert event["text"] == "The code from the SMS?"
    await response.streaming_content.aclose()

    # Another operator is not the one asked: the question's text never reaches their stream.
    @sync_to_async
    def seen_by_another_operator() -> list[str]:
        other = user_with_role(Role.OPERATORS, username="otto")
        batch = events_stream.events_read(
            raw_token=make_token(other, ["questions:answer"]),
            after=question_event - 1,
            flt=events_stream.StreamFilter(),
        )
        assert batch is not None
        return batch.messages

    assert await seen_by_another_operator() == []


async def test_it_refuses_a_token_without_an_event_scope(operator: User) -> None:
    token = await sync_to_async(make_token)(operator, ["workflows:read"])
    response = await open_stream(token)
    assert response.status_code == 403
    assert response["Content-Type"] == "application/problem+json"
    assert "runs:read" in response.json()["detail"]


async def test_it_refuses_a_request_without_a_token(db: None) -> None:
    response = await AsyncClient().get("/api/v1/events")
    assert response.status_code == 401
    assert response["Content-Type"] == "application/problem+json"


async def test_it_names_an_unknown_workflow(operator: User) -> None:
    response = await open_stream(await sync_to_async(make_token)(operator), "?workflow=nope")
    assert response.status_code == 422
    assert response.json()["errors"] == [
        {"field": "workflow", "message": "no workflow has the slug 'nope'"}
    ]


async def test_it_starts_at_the_newest_event_without_a_last_event_id(
    operator: User, demo_workflow: Workflow
) -> None:
    run = await sync_to_async(launch)(operator, demo_workflow)
    await step_done(run.pk, 0)
    response = await open_stream(await sync_to_async(make_token)(operator))
    fresh = await step_done(run.pk, 1)
    assert (await next_event(response))["id"] == fresh
    assert await RunEvent.objects.filter(pk__lt=fresh).acount() > 0
    await response.streaming_content.aclose()


async def test_it_streams_through_the_asgi_handler_and_stops_when_the_client_leaves(
    operator: User, demo_workflow: Workflow
) -> None:
    """What daphne runs: the response starts at once, events follow, a disconnect ends it."""
    run = await sync_to_async(launch)(operator, demo_workflow)
    app = await asgi_stream(await sync_to_async(make_token)(operator), f"run={run.pk}")

    event_id = await step_done(run.pk, 0)
    body = (await app.receive_output(timeout=10))["body"].decode()
    assert body.startswith(f"id: {event_id}\nevent: step\n")

    await app.send_input({"type": "http.disconnect"})
    await app.wait(timeout=10)


async def asgi_stream(token: str, query: str = "") -> ApplicationCommunicator:
    """A stream opened through Django's ASGI handler, past its retry hint."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/api/v1/events",
        "raw_path": b"/api/v1/events",
        "query_string": query.encode(),
        "headers": [(b"host", b"testserver"), (b"authorization", f"Bearer {token}".encode())],
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 50000),
    }
    app = ApplicationCommunicator(get_asgi_application(), scope)
    await app.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await app.receive_output(timeout=10)
    assert (start["type"], start["status"]) == ("http.response.start", 200)
    assert (await app.receive_output(timeout=10))["body"].startswith(b"retry:")
    return app


async def test_a_token_that_reads_runs_but_not_approvals_hears_the_wait_as_a_status(
    operator: User, demo_workflow: Workflow
) -> None:
    run = await sync_to_async(launch)(operator, demo_workflow)
    token = await sync_to_async(make_token)(operator, ["runs:read"])
    response = await open_stream(token)

    @sync_to_async
    def awaiting_approval() -> int:
        with transaction.atomic():
            locked = lock_run(run.pk)
            event = event_append(
                locked, "status", {"from": "running", "to": "awaiting_approval", "reason": ""}
            )
            locked.save(update_fields=["last_event_seq"])
        return event.pk

    event_id = await awaiting_approval()
    event = await next_event(response)
    assert (event["id"], event["event"], event["status"]) == (
        event_id,
        "run.status",
        "awaiting_approval",
    )
    assert "approval" not in event
    await response.streaming_content.aclose()


def test_the_stream_waits_at_a_missing_id_until_it_has_waited_long_enough(
    operator: User, demo_workflow: Workflow
) -> None:
    """An id below a committed one may still commit: the read stops there until the stream says
    it has waited, and then loses nothing after the gap."""
    run = launch(operator, demo_workflow)
    token = make_token(operator)
    before = RunEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    rolled_back = async_to_sync(step_done)(run.pk, 0)
    after_gap = async_to_sync(step_done)(run.pk, 1)
    RunEvent.objects.filter(pk=rolled_back).delete()

    waiting = events_stream.events_read(
        raw_token=token, after=before, flt=events_stream.StreamFilter()
    )
    assert waiting is not None
    assert (waiting.position, waiting.messages, waiting.at_gap) == (before, [], True)

    passed = events_stream.events_read(
        raw_token=token, after=before, flt=events_stream.StreamFilter(), pass_gap=True
    )
    assert passed is not None
    assert passed.position == after_gap
    assert [m.split("\n", 1)[0] for m in passed.messages] == [f"id: {after_gap}"]

    # Written long ago by the writers' clocks: a resuming client passes it at once.
    RunEvent.objects.filter(pk=after_gap).update(
        created_at=timezone.now() - events_stream.GAP_SETTLED - timedelta(seconds=1)
    )
    settled = events_stream.events_read(
        raw_token=token, after=before, flt=events_stream.StreamFilter()
    )
    assert settled is not None
    assert (settled.position, settled.at_gap) == (after_gap, False)


async def test_a_token_may_hold_only_a_few_streams_open(operator: User) -> None:
    token = await sync_to_async(make_token)(operator)
    through_asgi = await asgi_stream(token)
    others = [await open_stream(token) for _ in range(events_stream.STREAMS_PER_TOKEN - 1)]
    for response in others:
        assert response.status_code == 200
        await anext(response.streaming_content)  # counted once it has started

    refused = await open_stream(token)
    assert refused.status_code == 429
    assert "already has" in refused.json()["detail"]

    # A client that leaves gives its place back.
    await through_asgi.send_input({"type": "http.disconnect"})
    await through_asgi.wait(timeout=10)
    again = await open_stream(token)
    assert again.status_code == 200


@pytest.fixture
def polls_far_apart(monkeypatch: pytest.MonkeyPatch) -> list[asyncio.Event]:
    """No poll within a test's time; each stream's pick from a read sets the next event of the
    list it returns, so a test knows when a stream has read and waits."""
    monkeypatch.setattr(events_stream, "POLL_SECONDS", 60.0)
    reads: list[asyncio.Event] = []
    pick = events_stream.batch_for

    def counted(*args: Any) -> Any:
        batch = pick(*args)
        reads.append(asyncio.Event())
        reads[-1].set()
        return batch

    monkeypatch.setattr(events_stream, "batch_for", counted)
    return reads


async def test_a_commit_wakes_every_waiting_stream_before_its_poll(
    operator: User,
    demo_workflow: Workflow,
    polls_far_apart: list[asyncio.Event],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = await sync_to_async(launch)(operator, demo_workflow)
    token = await sync_to_async(make_token)(operator)
    streams = [await asgi_stream(token) for _ in range(2)]
    while len(polls_far_apart) < len(streams):
        await asyncio.sleep(0)  # until both have read once and wait for their poll
    # One fan-out, with one subscription to the channel layer, serves every stream of the process.
    fan_out = events_stream._fan_out
    assert fan_out is not None
    assert len(fan_out.streams) == len(streams)

    read_after: list[int] = []
    find = events_stream._events_found_async

    async def counted(**kwargs: Any) -> Any:
        read_after.append(kwargs["after"])
        return await find(**kwargs)

    monkeypatch.setattr(events_stream, "_events_found_async", counted)

    # The embedded default's writer: a thread of its own, with no event loop of the server's.
    event_id = await asyncio.to_thread(writer_step_done, run.pk, 0)

    for app in streams:
        body = (await app.receive_output(timeout=10))["body"].decode()
        assert body.startswith(f"id: {event_id}\nevent: step\n")
    # Woken together at the same position, the streams read the log once between them.
    assert len([after for after in read_after if after < event_id]) == 1
    # It leaves with the last stream.
    for app in streams:
        await app.send_input({"type": "http.disconnect"})
        await app.wait(timeout=10)
    assert events_stream._fan_out is None
    await asyncio.gather(*fan_out.tasks, return_exceptions=True)
    assert all(task.cancelled() for task in fan_out.tasks)


async def test_an_event_the_channel_layer_never_told_of_arrives_at_the_next_poll(
    operator: User, demo_workflow: Workflow
) -> None:
    run = await sync_to_async(launch)(operator, demo_workflow)
    response = await open_stream(await sync_to_async(make_token)(operator))

    @sync_to_async
    def written_without_a_message() -> int:
        with transaction.atomic():
            locked = lock_run(run.pk)
            locked.last_event_seq += 1
            locked.save(update_fields=["last_event_seq"])
            return RunEvent.objects.create(
                run=locked, seq=locked.last_event_seq, type="step", payload={"index": 0}
            ).pk

    event_id = await written_without_a_message()
    assert (await next_event(response))["id"] == event_id
    await response.streaming_content.aclose()


async def test_a_revoked_token_ends_its_streams_within_a_recheck(
    operator: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events_stream, "TOKEN_RECHECK_SECONDS", 0.05)
    token = await sync_to_async(make_token)(operator)
    kept = await sync_to_async(make_token)(operator)
    revoked = [await asgi_stream(token) for _ in range(2)]
    other = await asgi_stream(kept)

    @sync_to_async
    def revoke() -> None:
        token_revoke(
            token_id=ApiToken.objects.get(secret_sha256=hash_secret(token)).pk, actor=operator
        )

    await revoke()
    for app in revoked:
        body = (await app.receive_output(timeout=5))["body"].decode()
        assert body == 'event: end\ndata: {"reason":"the token no longer works"}\n\n'
        assert not (await app.receive_output(timeout=5)).get("more_body")  # the response ends
    # The other token's stream goes on.
    fan_out = events_stream._fan_out
    assert fan_out is not None
    assert [stream.raw_token for stream in fan_out.streams] == [kept]
    await other.send_input({"type": "http.disconnect"})
    await other.wait(timeout=10)


def test_the_fan_out_checks_every_token_of_its_streams_in_a_few_queries(
    operator: User, django_assert_max_num_queries: Any
) -> None:
    tokens = [make_token(operator) for _ in range(13)]
    revoked = make_token(operator)
    token_revoke(
        token_id=ApiToken.objects.get(secret_sha256=hash_secret(revoked)).pk, actor=operator
    )
    events_stream.viewers_get([*tokens, revoked])  # last_used_at written: at most once a minute

    # However many tokens and owners: one for the tokens and their owners, three for the owners'
    # roles (global capabilities through groups and their own, team memberships), one for their
    # groups.
    with django_assert_max_num_queries(5):
        viewers = events_stream.viewers_get([*tokens, revoked, "pw_unknown"])

    assert viewers[revoked] is None
    assert viewers["pw_unknown"] is None
    assert {viewers[token].context.user for token in tokens} == {operator}  # type: ignore[union-attr]
    assert all(Role.OPERATORS.value in viewers[token].groups for token in tokens)  # type: ignore[union-attr]


def two_teams(workflow: Workflow) -> tuple[User, User]:
    """Moves ``workflow`` to team B; a team-A and a team-B operator."""
    team_b = team_make("team-b")
    Workflow.objects.filter(pk=workflow.pk).update(team=team_b)
    return member_of(team_make("team-a"), Role.OPERATORS), member_of(team_b, Role.OPERATORS)


async def test_a_stream_hears_only_its_owners_teams(
    operator: User, demo_workflow: Workflow
) -> None:
    team_a, team_b = await sync_to_async(two_teams)(demo_workflow)
    theirs = await sync_to_async(launch)(team_b, demo_workflow)
    outsider = await open_stream(await sync_to_async(make_token)(team_a), f"?run={theirs.pk}")
    insider = await open_stream(await sync_to_async(make_token)(team_b))
    missing = await open_stream(
        await sync_to_async(make_token)(team_a), "?workflow=acme-pay-invoice"
    )

    await step_done(theirs.pk, 0)

    assert (await next_event(insider))["run"] == theirs.pk
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(1):
            await next_event(outsider)
    # Another team's workflow is named as a missing one is.
    assert missing.status_code == 422
    assert "no workflow has the slug 'acme-pay-invoice'" in missing.content.decode()
    await insider.streaming_content.aclose()
    await outsider.streaming_content.aclose()


def test_a_wait_the_owner_may_not_see_the_request_of_is_heard_as_a_status_change() -> None:
    """A reviewer in team A who watches team B's runs (as an operator there) hears B's approval
    wait as a run status, and A's with the request; a question asked of someone else likewise."""
    everything = frozenset(Scope)
    owner = User(pk=7, username="pat")
    context = TokenContext(
        token_id=1, name="t", kind="personal", user=owner, scopes=everything,
        effective=everything, principal="token:1", access=NO_ACCESS,
    )  # fmt: skip
    viewer = events_stream.Viewer(
        context=context, groups=frozenset(), run_teams=frozenset({1, 2}),
        approval_teams=frozenset({1}), team_roles=frozenset({(1, "Reviewers"), (2, "Operators")}),
    )  # fmt: skip
    data = {
        "run": 5, "workflow": "pay", "at": "2026-12-06T10:00:00+00:00", "status": "x",
        "previous": "running", "reason": "", "links": {"run": "/api/v1/runs/5"}, "approval": {},
    }  # fmt: skip

    def wait(pk: int, team: int, to: str, asks: str = "") -> events_stream.Found:
        return events_stream.Found(
            pk=pk, run_id=5, workflow_id=3, team_id=team, launched_by_id=9, type="status",
            to=to, data=data, asks=asks,
        )  # fmt: skip

    read = events_stream.Read(
        position=4,
        at_gap=False,
        found=(
            wait(1, 1, Run.Status.AWAITING_APPROVAL),
            wait(2, 2, Run.Status.AWAITING_APPROVAL),
            wait(3, 2, Run.Status.AWAITING_ANSWER, asks="Reviewers"),
            wait(4, 3, Run.Status.AWAITING_APPROVAL),
        ),
    )

    sent = events_stream.batch_for(read, viewer, events_stream.StreamFilter()).messages

    assert [message.split("\n")[1] for message in sent] == [
        "event: approval.requested",
        "event: run.status",
        "event: run.status",
    ]
    assert '"approval"' not in sent[1]
