"""``GET /api/v1/events``: runs, steps, approvals and questions as Server-Sent Events.

Every event streamed is a ``RunEvent`` row first (the run page's log), and its SSE ``id`` is the
row's primary key, so ``Last-Event-ID`` resumes from the database and loses nothing the stream
did not send. A stream reads the table when the channel layer says a run's events were committed
(one subscription per server process, however many streams it has open) and at least every
``POLL_SECONDS`` besides, so a lost or late message delays an event, never loses it. Streams at
the same position share one read of the log (woken together by a commit, they would otherwise
queue for the few database threads one after another); each then picks, in memory, what its
filter and its token's scopes let through, and checks its token again once a second. Each read
borrows a database connection on a consumer-read thread and gives it back, and the request gives
back the one it started with, so an idle stream holds none.

Ninja's operations are sync request/response functions, so this is a plain async Django view,
routed under /api/v1/ by ``urls.api_urls``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.urls import reverse
from django.utils import timezone

from approvals.models import ApprovalRequest, Question
from pandaweb.api import problems, ratelimit
from pandaweb.api.problems import Problem
from pandaweb.api.scopes import Scope
from pandaweb.api.services import BEARER_NEEDED, TokenContext, token_authenticate, token_refusal
from pandaweb.core.consumers import read_only
from sessions.events import RUNS_GROUP
from sessions.layer import receive_group_on_this_loop, stop_receiving_group_on_this_loop
from sessions.models import Run, RunEvent
from workflows.models import Workflow

logger = logging.getLogger(__name__)

# How often a stream reads with no word from the channel layer.
POLL_SECONDS = 1.0
# The channel layer forgets a group's member after a day (channels_redis' group_expiry).
GROUP_RENEW_SECONDS = 3600.0
HEARTBEAT_SECONDS = 15.0
BATCH = 200
# An id can commit after a higher one (PostgreSQL hands out ids before commit): the stream waits
# at a missing id rather than pass it for good. A gap the stream itself has watched this long
# (on its own clock, which no other host's skew moves) is a rolled-back insert or a deleted run,
# never coming; so is one below an event written longer ago than GAP_SETTLED by the writers'
# clocks, which lets a resuming client pass old gaps at once.
GAP_GRACE_SECONDS = 10.0
GAP_SETTLED = timedelta(minutes=5)
# Each open stream polls on one of the few threads that reach the database for websockets and
# streams: a token gets a handful, so one client cannot take them all.
STREAMS_PER_TOKEN = 4
# A stream checks its token again at most this often (revoked, expired, its owner's role): the
# reads themselves are shared by every stream at the same position.
TOKEN_RECHECK_SECONDS = 1.0
STREAM_SCOPES = (Scope.RUNS_READ, Scope.APPROVALS_READ, Scope.QUESTIONS_ANSWER)
STREAMED_TYPES = ("status", "step")


@dataclass(frozen=True)
class Found:
    """One streamed event as read once for every stream at the same position: its data as a
    token that sees everything gets it, and what narrower tokens and filters are decided on."""

    pk: int
    run_id: int
    workflow_id: int
    launched_by_id: int | None
    type: str
    to: str | None
    data: dict[str, Any]
    # Whom a question asks (its ``answered_by``); empty for anything else.
    asks: str = ""


@dataclass(frozen=True)
class Read:
    """What one read of the log found after a position, for every stream there."""

    position: int
    at_gap: bool
    found: tuple[Found, ...]


@dataclass(frozen=True)
class Viewer:
    """A stream's token as last checked, with its owner's groups (whom questions ask)."""

    context: TokenContext
    groups: frozenset[str]


@dataclass(frozen=True)
class StreamFilter:
    """Empty sets select everything."""

    workflow_ids: frozenset[int] = frozenset()
    run_ids: frozenset[int] = frozenset()

    def selects(self, found: Found) -> bool:
        return (not self.workflow_ids or found.workflow_id in self.workflow_ids) and (
            not self.run_ids or found.run_id in self.run_ids
        )


@dataclass
class Batch:
    """What one read found: the events to send and the id the stream has read up to."""

    position: int
    messages: list[str] = field(default_factory=list)
    # Stopped below an id not yet committed (or never to be).
    at_gap: bool = False


def _fullest_kind(event_type: str, to: str | None) -> str:
    """The SSE event type of a run's log entry for a token that sees everything."""
    if event_type == "step":
        return "step"
    if to == Run.Status.AWAITING_APPROVAL:
        return "approval.requested"
    if to == Run.Status.AWAITING_ANSWER:
        return "question.asked"
    return "run.status"


def _kind(found: Found, context: TokenContext) -> str | None:
    """The SSE event type of a run's log entry as this token sees it, or None if it sees none.

    A run waiting for an approval or an answer is still a change of the run's status: a token
    that may read runs but not approvals hears it as one, without the request's details.
    """
    fullest = _fullest_kind(found.type, found.to)
    if fullest == "approval.requested" and context.allows(Scope.APPROVALS_READ):
        return fullest
    if fullest == "question.asked" and context.allows(Scope.QUESTIONS_ANSWER):
        return fullest
    if not context.allows(Scope.RUNS_READ):
        return None
    return "step" if fullest == "step" else "run.status"


def _opened_with(model: type[ApprovalRequest] | type[Question], event: RunEvent) -> Any:
    """The request (or question) opened in the transaction that moved the run: the newest one
    made before the event."""
    return (
        model.objects.filter(run_id=event.run_id, created_at__lte=event.created_at)
        .order_by("-pk")
        .first()
    )


def _data(kind: str, event: RunEvent) -> tuple[dict[str, Any], str]:
    """The event's data as ``kind``, and whom it asks if it is a question."""
    run = event.run
    data: dict[str, Any] = {
        "run": run.pk,
        "workflow": run.workflow.slug,
        "at": event.created_at.isoformat(),
        "links": {"run": reverse("api:run_get", kwargs={"run_id": run.pk})},
    }
    payload = event.payload
    if kind == "step":
        data.update(index=payload.get("index"), status=payload.get("status"))
        return data, ""
    data.update(
        status=payload.get("to"), previous=payload.get("from"), reason=payload.get("reason")
    )
    if kind == "approval.requested":
        approval = _opened_with(ApprovalRequest, event)
        if approval is not None:
            data.update(approval=approval.pk, step_id=approval.step_id, action=approval.action)
            data["links"]["approval"] = reverse(
                "api:approval_get", kwargs={"approval_id": approval.pk}
            )
    elif kind == "question.asked":
        question = _opened_with(Question, event)
        if question is not None:
            data.update(question=question.pk, step_id=question.step_id, text=question.text)
            return data, question.answered_by
    return data, ""


def _status_only(data: dict[str, Any]) -> dict[str, Any]:
    """A wait's data without the request's (or question's) details."""
    kept = {key: data[key] for key in ("run", "workflow", "at", "status", "previous", "reason")}
    return {**kept, "links": {"run": data["links"]["run"]}}


def format_event(event_id: int, kind: str, data: dict[str, Any]) -> str:
    body = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"id: {event_id}\nevent: {kind}\ndata: {body}\n\n"


def events_found(*, after: int, pass_gap: bool = False) -> Read:
    """The streamed events after ``after``, for every stream there, whatever its token and
    filter. How far the read may go is decided on every event's id; ``pass_gap``: the stream has
    waited at the first missing id long enough."""
    settled_before = timezone.now() - GAP_SETTLED
    position, at_gap = after, False
    ids = RunEvent.objects.filter(pk__gt=after).order_by("pk").values_list("pk", "created_at")
    for pk, created_at in ids[:BATCH]:
        if pk != position + 1 and created_at > settled_before:
            if not pass_gap:
                at_gap = True
                break
            pass_gap = False  # one gap at a time: the next waits its own turn
        position = pk
    if position == after:
        return Read(position=position, at_gap=at_gap, found=())
    events = RunEvent.objects.filter(pk__gt=after, pk__lte=position, type__in=STREAMED_TYPES)
    found = []
    for event in events.select_related("run__workflow").order_by("pk"):
        to = event.payload.get("to") if event.type == "status" else None
        data, asks = _data(_fullest_kind(event.type, to), event)
        found.append(
            Found(
                pk=event.pk,
                run_id=event.run_id,
                workflow_id=event.run.workflow_id,
                launched_by_id=event.run.launched_by_id,
                type=event.type,
                to=to,
                data=data,
                asks=asks,
            )
        )
    return Read(position=position, at_gap=at_gap, found=tuple(found))


def viewer_get(raw_token: str) -> Viewer | None:
    """The token as it is now, or None once it no longer works (revoked, expired, its owner
    switched off)."""
    context = token_authenticate(raw_token)
    if context is None:
        return None
    return Viewer(context, frozenset(context.user.groups.values_list("name", flat=True)))


def batch_for(read: Read, viewer: Viewer, flt: StreamFilter) -> Batch:
    """What one stream sends of a read: its filter's events, as its token sees them. No query."""
    batch = Batch(position=read.position, at_gap=read.at_gap)
    for found in read.found:
        if not flt.selects(found):
            continue
        kind = _kind(found, viewer.context)
        if kind is None or (kind == "question.asked" and not _asked_of(viewer, found)):
            continue
        fullest = kind == _fullest_kind(found.type, found.to)
        data = found.data if fullest else _status_only(found.data)
        batch.messages.append(format_event(found.pk, kind, data))
    return batch


def events_read(
    *, raw_token: str, after: int, flt: StreamFilter, pass_gap: bool = False
) -> Batch | None:
    """One stream's read on its own (what the stream does, shared with others, in one call),
    or None once the token no longer works."""
    viewer = viewer_get(raw_token)
    if viewer is None:
        return None
    return batch_for(events_found(after=after, pass_gap=pass_gap), viewer, flt)


def _asked_of(viewer: Viewer, found: Found) -> bool:
    """Whether the viewer is the one a question asks: the run's launcher, or a member of the
    group it asks (the rule the question list of the API follows; others never see its text)."""
    if not found.asks:
        return False
    if found.asks == "launcher":
        return found.launched_by_id == viewer.context.user.pk
    return found.asks in viewer.groups


def _latest_id() -> int:
    return RunEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


def _workflow_ids(slugs: set[str]) -> dict[str, int]:
    return dict(Workflow.objects.filter(slug__in=slugs).values_list("slug", "pk"))


# Streams open in this server process, by token (an OAuth client's access tokens count as one).
_open_streams: Counter[str] = Counter()


async def _counted(principal: str, body: AsyncIterator[str]) -> AsyncIterator[str]:
    """``body``, counted among the token's open streams until it ends or the client leaves."""
    _open_streams[principal] += 1
    try:
        async for chunk in body:
            yield chunk
    finally:
        _open_streams[principal] -= 1
        if not _open_streams[principal]:
            del _open_streams[principal]


_authenticate_async = read_only(token_authenticate)
_refusal_async = read_only(token_refusal)
_viewer_async = read_only(viewer_get)
_events_found_async = read_only(events_found)
_latest_id_async = read_only(_latest_id)
_workflow_ids_async = read_only(_workflow_ids)
# The request's thread took a connection before the view (core.database) and would hold it as
# long as the stream lasts: a process's pool would bound its streams. Given back as a request's
# end gives it back; the view's reads borrow their own.
_request_connection_given_back = sync_to_async(close_old_connections)


class CommitListener:
    """This process's one member of the runs group on the channel layer: every committed run
    event (``sessions.events.publish_run_events``) wakes all of its open streams at once, which
    then read the database as they would on their poll. Lives while streams are open."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.loop = asyncio.get_running_loop()
        self.streams = 0
        self.committed = asyncio.Event()
        self.task = self.loop.create_task(self._listen())

    def _wake(self) -> None:
        self.committed.set()
        self.committed = asyncio.Event()

    async def _listen(self) -> None:
        channel = await self.layer.new_channel()
        # The embedded default's writers commit on other threads: their message must be sent on
        # this loop to wake it (sessions.layer).
        receive_group_on_this_loop(RUNS_GROUP)
        receiving: asyncio.Future[Any] | None = None
        try:
            while True:
                await self.layer.group_add(RUNS_GROUP, channel)
                renew_at = self.loop.time() + GROUP_RENEW_SECONDS
                while (left := renew_at - self.loop.time()) > 0:
                    receiving = receiving or asyncio.ensure_future(self.layer.receive(channel))
                    done, _ = await asyncio.wait({receiving}, timeout=left)
                    if done:
                        message = receiving.result()
                        receiving = None
                        if message.get("type") == "runs.changed":
                            self._wake()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.warning("event streams poll only: the channel layer failed", exc_info=True)
        finally:
            if receiving is not None:
                receiving.cancel()
            stop_receiving_group_on_this_loop(RUNS_GROUP)
            # Streams waiting now read at once rather than after their poll.
            self._wake()
            if not self.loop.is_closed():
                self.loop.create_task(self._leave(channel))

    async def _leave(self, channel: str) -> None:
        try:
            await self.layer.group_discard(RUNS_GROUP, channel)
        except Exception:
            logger.warning("could not leave the runs group", exc_info=True)


_listener: CommitListener | None = None
_listener_failed_at = float("-inf")


def _listener_joined() -> CommitListener | None:
    """The running loop's listener, started if need be, counting the caller among its streams;
    None without a channel layer, or for a while after it failed."""
    global _listener, _listener_failed_at
    layer = get_channel_layer()
    if layer is None:
        return None
    listener = _listener
    if listener is not None and listener.task.done() and not listener.task.cancelled():
        _listener_failed_at, listener = time.monotonic(), None
    if listener is None or listener.loop is not asyncio.get_running_loop():
        if time.monotonic() - _listener_failed_at < HEARTBEAT_SECONDS:
            return None
        listener = _listener = CommitListener(layer)
    listener.streams += 1
    return listener


def _listener_left(listener: CommitListener | None) -> None:
    global _listener
    if listener is None:
        return
    listener.streams -= 1
    if listener.streams <= 0 and listener is _listener:
        listener.task.cancel()
        _listener = None


# Reads under way, by the position they read after, whether they pass a gap, and the wake they
# follow: streams woken by the same commit at the same position share one read, and a stream
# woken by a later commit never takes a read begun before it.
_reads: dict[tuple[int, bool, asyncio.Event | None], asyncio.Future[Read]] = {}


async def _read_shared(after: int, pass_gap: bool, committed: asyncio.Event | None) -> Read:
    key = (after, pass_gap, committed)
    pending = _reads.get(key)
    if pending is None or pending.get_loop() is not asyncio.get_running_loop():
        pending = asyncio.ensure_future(_events_found_async(after=after, pass_gap=pass_gap))
        _reads[key] = pending

        def forget(done: asyncio.Future[Read], key: Any = key) -> None:
            if _reads.get(key) is done:
                del _reads[key]

        pending.add_done_callback(forget)
    # Shielded: a stream whose client leaves must not cancel the read the others wait for.
    return await asyncio.shield(pending)


async def _committed_or_poll(committed: asyncio.Event | None) -> None:
    try:
        if committed is None:
            await asyncio.sleep(POLL_SECONDS)
        else:
            await asyncio.wait_for(committed.wait(), POLL_SECONDS)
    except TimeoutError:
        pass


async def stream(*, raw_token: str, after: int, flt: StreamFilter) -> AsyncIterator[str]:
    """The SSE body: events as they are written, a keepalive comment when there are none."""
    listener = _listener_joined()
    try:
        async for chunk in _stream(listener, raw_token=raw_token, after=after, flt=flt):
            yield chunk
    finally:
        _listener_left(listener)


async def _stream(
    listener: CommitListener | None, *, raw_token: str, after: int, flt: StreamFilter
) -> AsyncIterator[str]:
    position = after
    # Tell the client how soon to reconnect; the first bytes also open the response at once.
    yield f"retry: {int(POLL_SECONDS * 3000)}\n\n"
    quiet_since = time.monotonic()
    gap_since: float | None = None
    viewer: Viewer | None = None
    checked_at = float("-inf")
    while True:
        waited_out = gap_since is not None and time.monotonic() - gap_since >= GAP_GRACE_SECONDS
        # Taken before the read: a commit during it wakes the wait below at once.
        committed = (
            listener.committed if listener is not None and not listener.task.done() else None
        )
        if viewer is None or time.monotonic() - checked_at >= TOKEN_RECHECK_SECONDS:
            viewer, checked_at = await _viewer_async(raw_token), time.monotonic()
            if viewer is None:
                yield 'event: end\ndata: {"reason":"the token no longer works"}\n\n'
                return
        batch = batch_for(await _read_shared(position, waited_out, committed), viewer, flt)
        for message in batch.messages:
            yield message
        if batch.messages:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= HEARTBEAT_SECONDS:
            yield ": keepalive\n\n"
            quiet_since = time.monotonic()
        if batch.position != position:
            position = batch.position
            gap_since = None
            continue  # more may be waiting behind a full batch
        if batch.at_gap and gap_since is None:
            gap_since = time.monotonic()
        await _committed_or_poll(committed)


def _bearer(request: HttpRequest) -> str:
    scheme, _, raw = request.headers.get("Authorization", "").partition(" ")
    return raw.strip() if scheme.lower() == "bearer" else ""


def _values(request: HttpRequest, name: str) -> list[str]:
    return [v.strip() for item in request.GET.getlist(name) for v in item.split(",") if v.strip()]


def _invalid(field_name: str, message: str) -> Problem:
    return Problem(
        422, "the request is not valid", errors=[{"field": field_name, "message": message}]
    )


async def _stream_filter(request: HttpRequest) -> StreamFilter:
    run_ids: set[int] = set()
    for text in _values(request, "run"):
        if not text.isdigit():
            raise _invalid("run", f"{text!r} is not a run id")
        run_ids.add(int(text))
    slugs = set(_values(request, "workflow"))
    found = await _workflow_ids_async(slugs) if slugs else {}
    unknown = sorted(slugs - found.keys())
    if unknown:
        raise _invalid("workflow", f"no workflow has the slug {unknown[0]!r}")
    return StreamFilter(workflow_ids=frozenset(found.values()), run_ids=frozenset(run_ids))


def _resume_from(request: HttpRequest) -> int | None:
    text = request.headers.get("Last-Event-ID") or request.GET.get("last_event_id", "")
    text = text.strip()
    if not text:
        return None
    if not text.isdigit():
        raise _invalid("last_event_id", f"{text!r} is not an event id")
    return int(text)


async def events_response(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    """Authenticate and authorize like every API operation, then stream."""
    # First: its reads below take connections of the same pool, which a burst of streams
    # opening at once would otherwise have taken all of.
    await _request_connection_given_back()
    if request.method != "GET":
        problem = Problem(405, "only GET streams events", headers={"Allow": "GET"})
        return problems.render(request, problem)
    raw_token = _bearer(request)
    context = await _authenticate_async(raw_token) if raw_token else None
    if context is None:
        detail = await _refusal_async(raw_token) if raw_token else BEARER_NEEDED
        return problems.render(
            request,
            Problem(401, detail, headers={"WWW-Authenticate": 'Bearer realm="pandaweb"'}),
        )
    verdict = ratelimit.check(
        ratelimit.default_counter(),
        context.principal,
        limit=settings.API_RATE_LIMIT_PER_MINUTE,
    )
    if not verdict.allowed:
        return problems.render(
            request,
            Problem(
                429,
                f"this token may make {verdict.limit} requests a minute; "
                f"try again in {verdict.retry_after} s",
                headers={"Retry-After": str(verdict.retry_after)},
            ),
        )
    if _open_streams[context.principal] >= STREAMS_PER_TOKEN:
        return problems.render(
            request,
            Problem(
                429,
                f"this token already has {STREAMS_PER_TOKEN} event streams open; close one, "
                "or filter one stream by several runs or workflows",
                headers={"Retry-After": str(int(POLL_SECONDS * 3))},
            ),
        )
    if not any(context.allows(scope) for scope in STREAM_SCOPES):
        names = ", ".join(f"'{scope.value}'" for scope in STREAM_SCOPES)
        return problems.render(
            request,
            Problem(403, f"this token needs one of the scopes {names}", type="missing-scope"),
        )
    try:
        flt = await _stream_filter(request)
        after = _resume_from(request)
    except Problem as problem:
        return problems.render(request, problem)
    if after is None:
        # A new subscriber hears what happens from now on; a resuming one, everything it missed.
        after = await _latest_id_async()
    response = StreamingHttpResponse(
        _counted(context.principal, stream(raw_token=raw_token, after=after, flt=flt)),
        content_type="text/event-stream",
    )
    response["Cache-Control"] = "no-cache"
    # A reverse proxy must pass each event on as it comes, not when its buffer fills.
    response["X-Accel-Buffering"] = "no"
    return response
