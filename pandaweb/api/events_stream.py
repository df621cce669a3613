"""``GET /api/v1/events``: runs, steps, approvals and questions as Server-Sent Events.

Every event streamed is a ``RunEvent`` row first (the run page's log), and its SSE ``id`` is the
row's primary key, so ``Last-Event-ID`` resumes from the database and loses nothing the stream
did not send. A server process serves all of its streams through one ``FanOut``. Woken by the
channel layer when a run's events were committed (one subscription per process), and at least
every ``POLL_SECONDS`` besides so that a lost or late message delays an event but never loses
it, the fan-out reads the log once for every stream at the same position and puts in each
stream's outbox what its filter and its token's scopes let through; it checks all of its
streams' tokens once a second, in one go. Each read borrows a database connection on a
consumer-read thread and gives it back, and the request gives back the one it started with, so
an idle stream holds none.

Ninja's operations are sync request/response functions, so this is a plain async Django view,
routed under /api/v1/ by ``urls.api_urls``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Coroutine, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth.models import User
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.urls import reverse
from django.utils import timezone

from approvals.models import ApprovalRequest, Question
from pandaweb.api import problems, ratelimit
from pandaweb.api.problems import Problem
from pandaweb.api.scopes import Scope
from pandaweb.api.services import BEARER_NEEDED, TokenContext, token_refusal, tokens_authenticate
from pandaweb.core.consumers import read_only
from pandaweb.core.permissions import in_teams
from pandaweb.core.roles import Capability
from sessions.events import RUNS_GROUP
from sessions.layer import receive_group_on_this_loop, stop_receiving_group_on_this_loop
from sessions.models import Run, RunEvent
from workflows.models import Workflow

logger = logging.getLogger(__name__)

# How often the fan-out reads with no word from the channel layer.
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
# A stream catching up reads on its own (one of the few threads that reach the database for
# websockets and streams): a token gets a handful, so one client cannot take them all.
STREAMS_PER_TOKEN = 4
# How soon a stream ends after its token stops working (revoked, expired, its owner's role).
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
    team_id: int | None
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
    """A stream's token as last checked, with its owner's groups (whom questions ask) and the
    teams whose runs and approvals the owner may see (None: every team)."""

    context: TokenContext
    groups: frozenset[str]
    run_teams: frozenset[int] | None = None
    approval_teams: frozenset[int] | None = None
    # (team id, role) of each team membership: a question asked of a role reaches its members
    # in the run's team.
    team_roles: frozenset[tuple[int, str]] = frozenset()


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


def _kind(found: Found, viewer: Viewer) -> str | None:
    """The SSE event type of a run's log entry as this stream sees it, or None if it sees none.

    A run waiting for an approval or an answer is still a change of the run's status: a stream
    that may read the run but not the request (the token's scopes, the owner's teams, whom a
    question asks) hears it as one, without the request's details.
    """
    fullest = _fullest_kind(found.type, found.to)
    context = viewer.context
    if (
        fullest == "approval.requested"
        and context.allows(Scope.APPROVALS_READ)
        and _reaches(viewer.approval_teams, found)
    ):
        return fullest
    if not _reaches(viewer.run_teams, found):
        return None
    if (
        fullest == "question.asked"
        and context.allows(Scope.QUESTIONS_ANSWER)
        and _asked_of(viewer, found)
    ):
        return fullest
    if not context.allows(Scope.RUNS_READ):
        return None
    return "step" if fullest == "step" else "run.status"


def _reaches(teams: frozenset[int] | None, found: Found) -> bool:
    """The team rule (``pandaweb.core.permissions.teams_where``) for one event."""
    return teams is None or found.team_id in teams


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
                team_id=event.run.team_id,
                launched_by_id=event.run.launched_by_id,
                type=event.type,
                to=to,
                data=data,
                asks=asks,
            )
        )
    return Read(position=position, at_gap=at_gap, found=tuple(found))


def viewers_get(raw_tokens: Iterable[str]) -> dict[str, Viewer | None]:
    """Each token as it is now, or None once it no longer works (revoked, expired, its owner
    switched off): what ``token_authenticate`` says of each, in one go for all, and one query
    for the owners' groups."""
    contexts = tokens_authenticate(raw_tokens)
    owners = {context.user.pk: context.user for context in contexts.values() if context}
    groups: dict[int, set[str]] = {owner: set() for owner in owners}
    memberships = User.groups.through.objects.filter(user_id__in=owners)
    for user_id, name in memberships.values_list("user_id", "group__name"):
        groups[user_id].add(name)
    return {
        raw: None
        if context is None
        else Viewer(
            context,
            frozenset(groups[context.user.pk]),
            run_teams=context.access.teams_where(Capability.VIEW_RUNS),
            approval_teams=context.access.teams_where(Capability.VIEW_APPROVALS),
            team_roles=context.access.team_roles,
        )
        for raw, context in contexts.items()
    }


def viewer_get(raw_token: str) -> Viewer | None:
    return viewers_get([raw_token])[raw_token]


def batch_for(read: Read, viewer: Viewer, flt: StreamFilter) -> Batch:
    """What one stream sends of a read: its filter's events, as its token sees them. No query."""
    batch = Batch(position=read.position, at_gap=read.at_gap)
    for found in read.found:
        if not flt.selects(found):
            continue
        kind = _kind(found, viewer)
        if kind is None:
            continue
        fullest = kind == _fullest_kind(found.type, found.to)
        data = found.data if fullest else _status_only(found.data)
        batch.messages.append(format_event(found.pk, kind, data))
    return batch


def events_read(
    *, raw_token: str, after: int, flt: StreamFilter, pass_gap: bool = False
) -> Batch | None:
    """One stream's read on its own (what the fan-out does for it, in one call), or None once
    the token no longer works."""
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
    return found.asks in viewer.groups or (found.team_id, found.asks) in viewer.team_roles


def _latest_id() -> int:
    return RunEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


def _workflow_ids(slugs: set[str], user: User) -> dict[str, int]:
    # Another team's workflow is named as a missing one is.
    visible = in_teams(Workflow.objects.filter(slug__in=slugs), user, Capability.VIEW_WORKFLOWS)
    return dict(visible.values_list("slug", "pk"))


_refusal_async = read_only(token_refusal)
_viewer_async = read_only(viewer_get)
_viewers_async = read_only(viewers_get)
_events_found_async = read_only(events_found)
_latest_id_async = read_only(_latest_id)
_workflow_ids_async = read_only(_workflow_ids)
# The request's thread took a connection before the view (core.database) and would hold it as
# long as the stream lasts: a process's pool would bound its streams. Given back as a request's
# end gives it back; the view's reads borrow their own.
_request_connection_given_back = sync_to_async(close_old_connections)

# What a stream's outbox holds after its last message: the stream ends.
_END = None


@dataclass(eq=False)
class Stream:
    """One open stream as the fan-out keeps it."""

    raw_token: str
    principal: str
    flt: StreamFilter
    viewer: Viewer
    # The id the stream has read up to.
    position: int
    # When the stream first stopped at the missing id it waits at now (its own clock).
    gap_since: float | None = None
    # What the fan-out has picked for the client, in order; ``_END`` ends the stream.
    outbox: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)

    def passes_gap(self, now: float) -> bool:
        return self.gap_since is not None and now - self.gap_since >= GAP_GRACE_SECONDS


class FanOut:
    """This process's open streams, served together on its server's loop.

    One member of the channel layer's runs group wakes the fan-out when a run's events are
    committed (``sessions.events.publish_run_events``), and every ``POLL_SECONDS`` without one.
    Awake, it reads the log once for each position its streams are at (one, but for streams
    catching up) and puts in each stream's outbox what its filter and token let through: a
    stream costs no read and no thread of its own, only its writes. Once a second it checks all
    of its streams' tokens in one go, beside the reads rather than before them (50 streams each
    checking its own queued before the read a commit waits for), and ends the streams of a
    token that no longer works. Lives while streams are open.
    """

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.streams: set[Stream] = set()
        self.woken = asyncio.Event()
        self.tasks = [
            self.loop.create_task(self._ending_on_failure(self._deliver())),
            self.loop.create_task(self._ending_on_failure(self._recheck())),
            self.loop.create_task(self._listen()),
        ]

    def open_for(self, principal: str) -> int:
        return sum(1 for stream in self.streams if stream.principal == principal)

    def join(self, stream: Stream) -> None:
        self.streams.add(stream)
        self.woken.set()  # its first read, at once

    def leave(self, stream: Stream) -> None:
        self.streams.discard(stream)
        if not self.streams:
            self._close()

    def _close(self) -> None:
        global _fan_out
        if _fan_out is self:
            _fan_out = None
        for task in self.tasks:
            task.cancel()
        for stream in list(self.streams):
            self._end(stream)

    def _end(self, stream: Stream, last: str | None = None) -> None:
        if last is not None:
            stream.outbox.put_nowait(last)
        stream.outbox.put_nowait(_END)
        self.streams.discard(stream)

    async def _ending_on_failure(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except Exception:
            # Its clients reconnect (``retry``) to a new fan-out and resume from their
            # Last-Event-ID; a token is never left unchecked.
            logger.warning("event streams ended: reading the database failed", exc_info=True)
            self._close()

    async def _deliver(self) -> None:
        while True:
            # Cleared before the read: a commit or a stream joining during it reads again.
            self.woken.clear()
            if not await self._read_once():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(POLL_SECONDS):
                        await self.woken.wait()

    async def _read_once(self) -> bool:
        """One read for each position its streams are at, each picked from as soon as it is
        done; whether any stream moved on (more may be waiting behind a full batch)."""
        now = time.monotonic()
        at: dict[tuple[int, bool], list[Stream]] = {}
        for stream in self.streams:
            at.setdefault((stream.position, stream.passes_gap(now)), []).append(stream)
        moved = await asyncio.gather(
            *(
                self._read_for(streams, after, pass_gap, now)
                for (after, pass_gap), streams in at.items()
            )
        )
        return any(moved)

    async def _read_for(
        self, streams: list[Stream], after: int, pass_gap: bool, now: float
    ) -> bool:
        read = await _events_found_async(after=after, pass_gap=pass_gap)
        for stream in streams:
            if stream not in self.streams:
                continue  # left, or its token stopped working, during the read
            for message in batch_for(read, stream.viewer, stream.flt).messages:
                stream.outbox.put_nowait(message)
            if read.position != after:
                stream.position, stream.gap_since = read.position, None
            elif read.at_gap and stream.gap_since is None:
                stream.gap_since = now
        return read.position != after

    async def _recheck(self) -> None:
        while True:
            await asyncio.sleep(TOKEN_RECHECK_SECONDS)
            tokens = {stream.raw_token for stream in self.streams}
            viewers = await _viewers_async(tokens) if tokens else {}
            for stream in list(self.streams):
                # A stream that opened during the check keeps the viewer it opened with.
                viewer = viewers.get(stream.raw_token, stream.viewer)
                if viewer is None:
                    self._end(
                        stream, 'event: end\ndata: {"reason":"the token no longer works"}\n\n'
                    )
                else:
                    stream.viewer = viewer

    async def _listen(self) -> None:
        """Wakes the fan-out on every message of the runs group; after a failure of the
        channel layer, polls alone serve for a while before it joins again."""
        layer = get_channel_layer()
        while layer is not None:
            channel = ""
            receiving: asyncio.Future[Any] | None = None
            # The embedded default's writers commit on other threads: their message must be
            # sent on this loop to wake it (sessions.layer).
            receive_group_on_this_loop(RUNS_GROUP)
            try:
                channel = await layer.new_channel()
                while True:
                    await layer.group_add(RUNS_GROUP, channel)
                    renew_at = self.loop.time() + GROUP_RENEW_SECONDS
                    while (left := renew_at - self.loop.time()) > 0:
                        receiving = receiving or asyncio.ensure_future(layer.receive(channel))
                        done, _ = await asyncio.wait({receiving}, timeout=left)
                        if done:
                            message = receiving.result()
                            receiving = None
                            if message.get("type") == "runs.changed":
                                self.woken.set()
            except Exception:
                logger.warning("event streams poll only: the channel layer failed", exc_info=True)
            finally:
                if receiving is not None:
                    receiving.cancel()
                stop_receiving_group_on_this_loop(RUNS_GROUP)
                # Streams waiting now read at once rather than after their poll.
                self.woken.set()
                if channel and not self.loop.is_closed():
                    self.loop.create_task(_leave(layer, channel))
            await asyncio.sleep(HEARTBEAT_SECONDS)


async def _leave(layer: Any, channel: str) -> None:
    try:
        await layer.group_discard(RUNS_GROUP, channel)
    except Exception:
        logger.warning("could not leave the runs group", exc_info=True)


_fan_out: FanOut | None = None


def _this_loops_fan_out() -> FanOut | None:
    fan_out = _fan_out
    return fan_out if fan_out is not None and fan_out.loop is asyncio.get_running_loop() else None


def _streams_open(principal: str) -> int:
    """The token's streams open in this server process (an OAuth client's access tokens count
    as one)."""
    fan_out = _this_loops_fan_out()
    return 0 if fan_out is None else fan_out.open_for(principal)


async def stream(
    *, raw_token: str, viewer: Viewer, after: int, flt: StreamFilter
) -> AsyncIterator[str]:
    """The SSE body: events as the fan-out picks them, a keepalive comment when there are none.
    Counted among the token's open streams from its first chunk until the client leaves."""
    global _fan_out
    fan_out = _this_loops_fan_out()
    if fan_out is None:
        fan_out = _fan_out = FanOut()
    mine = Stream(raw_token, viewer.context.principal, flt, viewer, position=after)
    fan_out.join(mine)
    try:
        # Tell the client how soon to reconnect; the first bytes also open the response at once.
        yield f"retry: {int(POLL_SECONDS * 3000)}\n\n"
        while True:
            try:
                async with asyncio.timeout(HEARTBEAT_SECONDS):
                    message = await mine.outbox.get()
            except TimeoutError:
                yield ": keepalive\n\n"
                continue
            if message is _END:
                return
            yield message
    finally:
        fan_out.leave(mine)


def _bearer(request: HttpRequest) -> str:
    scheme, _, raw = request.headers.get("Authorization", "").partition(" ")
    return raw.strip() if scheme.lower() == "bearer" else ""


def _values(request: HttpRequest, name: str) -> list[str]:
    return [v.strip() for item in request.GET.getlist(name) for v in item.split(",") if v.strip()]


def _invalid(field_name: str, message: str) -> Problem:
    return Problem(
        422, "the request is not valid", errors=[{"field": field_name, "message": message}]
    )


async def _stream_filter(request: HttpRequest, user: User) -> StreamFilter:
    run_ids: set[int] = set()
    for text in _values(request, "run"):
        if not text.isdigit():
            raise _invalid("run", f"{text!r} is not a run id")
        run_ids.add(int(text))
    slugs = set(_values(request, "workflow"))
    found = await _workflow_ids_async(slugs, user) if slugs else {}
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
    viewer = await _viewer_async(raw_token) if raw_token else None
    if viewer is None:
        detail = await _refusal_async(raw_token) if raw_token else BEARER_NEEDED
        return problems.render(
            request,
            Problem(401, detail, headers={"WWW-Authenticate": 'Bearer realm="pandaweb"'}),
        )
    context = viewer.context
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
    if _streams_open(context.principal) >= STREAMS_PER_TOKEN:
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
        flt = await _stream_filter(request, context.user)
        after = _resume_from(request)
    except Problem as problem:
        return problems.render(request, problem)
    if after is None:
        # A new subscriber hears what happens from now on; a resuming one, everything it missed.
        after = await _latest_id_async()
    response = StreamingHttpResponse(
        stream(raw_token=raw_token, viewer=viewer, after=after, flt=flt),
        content_type="text/event-stream",
    )
    response["Cache-Control"] = "no-cache"
    # A reverse proxy must pass each event on as it comes, not when its buffer fills.
    response["X-Accel-Buffering"] = "no"
    return response
