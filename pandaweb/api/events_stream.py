"""``GET /api/v1/events``: runs, steps, approvals and questions as Server-Sent Events.

Every event streamed is a ``RunEvent`` row first (the run page's log), and its SSE ``id`` is the
row's primary key, so ``Last-Event-ID`` resumes from the database and loses nothing the stream
did not send. The stream polls the table at a short interval: a query per second per client is
cheap, and unlike a channel-layer message (which the in-memory layer of the embedded default
does not deliver across threads) it cannot be missed. Each read borrows a database connection
on a consumer-read thread and gives it back, so an idle stream holds none.

Ninja's operations are sync request/response functions, so this is a plain async Django view,
routed under /api/v1/ by ``urls.api_urls``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.urls import reverse
from django.utils import timezone

from approvals.models import ApprovalRequest, Question
from pandaweb.api import problems, ratelimit
from pandaweb.api.problems import Problem
from pandaweb.api.scopes import Scope
from pandaweb.api.services import token_authenticate
from pandaweb.core.consumers import read_only
from sessions.models import Run, RunEvent
from workflows.models import Workflow

POLL_SECONDS = 1.0
HEARTBEAT_SECONDS = 15.0
BATCH = 200
# An id can commit after a higher one (PostgreSQL hands out ids before commit): an event newer
# than this waits for the missing ids below it rather than pass them for good. A gap older than
# this is a rolled-back insert or a deleted run, never coming.
GAP_GRACE = timedelta(seconds=10)
STREAM_SCOPES = (Scope.RUNS_READ, Scope.APPROVALS_READ, Scope.QUESTIONS_ANSWER)
STREAMED_TYPES = ("status", "step")


@dataclass(frozen=True)
class StreamFilter:
    """Empty sets select everything."""

    workflow_ids: frozenset[int] = frozenset()
    run_ids: frozenset[int] = frozenset()

    def selects(self, run: Run) -> bool:
        return (not self.workflow_ids or run.workflow_id in self.workflow_ids) and (
            not self.run_ids or run.pk in self.run_ids
        )


@dataclass
class Batch:
    """What one read found: the events to send and the id the stream has read up to."""

    position: int
    messages: list[str] = field(default_factory=list)


def _kind(event: RunEvent) -> tuple[str, Scope]:
    """The SSE event type of a run's log entry and the scope that sees it."""
    if event.type == "step":
        return "step", Scope.RUNS_READ
    to = event.payload.get("to")
    if to == Run.Status.AWAITING_APPROVAL:
        return "approval.requested", Scope.APPROVALS_READ
    if to == Run.Status.AWAITING_ANSWER:
        return "question.asked", Scope.QUESTIONS_ANSWER
    return "run.status", Scope.RUNS_READ


def _data(kind: str, event: RunEvent) -> dict[str, Any]:
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
        return data
    data.update(
        status=payload.get("to"), previous=payload.get("from"), reason=payload.get("reason")
    )
    # The request (or question) opened in the transaction that moved the run: the newest one
    # made before the event.
    if kind == "approval.requested":
        approval = (
            ApprovalRequest.objects.filter(run=run, created_at__lte=event.created_at)
            .order_by("-pk")
            .only("pk", "step_id", "action")
            .first()
        )
        if approval is not None:
            data.update(approval=approval.pk, step_id=approval.step_id, action=approval.action)
            data["links"]["approval"] = reverse(
                "api:approval_get", kwargs={"approval_id": approval.pk}
            )
    elif kind == "question.asked":
        question = (
            Question.objects.filter(run=run, created_at__lte=event.created_at)
            .order_by("-pk")
            .only("pk", "step_id", "text")
            .first()
        )
        if question is not None:
            data.update(question=question.pk, step_id=question.step_id, text=question.text)
    return data


def format_event(event_id: int, kind: str, data: dict[str, Any]) -> str:
    body = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"id: {event_id}\nevent: {kind}\ndata: {body}\n\n"


def events_read(*, raw_token: str, after: int, flt: StreamFilter) -> Batch | None:
    """The events after ``after`` this token may see, or None once the token no longer works
    (revoked, expired, its owner switched off): the check and the read are one trip."""
    context = token_authenticate(raw_token)
    if context is None:
        return None
    rows = list(
        RunEvent.objects.filter(pk__gt=after)
        .select_related("run__workflow")
        .only(
            "pk",
            "type",
            "payload",
            "created_at",
            "run__launched_by_id",
            "run__workflow_id",
            "run__workflow__slug",
        )
        .order_by("pk")[:BATCH]
    )
    settled_before = timezone.now() - GAP_GRACE
    batch = Batch(position=after)
    for event in rows:
        if event.pk != batch.position + 1 and event.created_at > settled_before:
            break
        batch.position = event.pk
        if event.type not in STREAMED_TYPES or not flt.selects(event.run):
            continue
        kind, scope = _kind(event)
        if not context.allows(scope):
            continue
        data = _data(kind, event)
        if kind == "question.asked" and not _asked_of(context.user, event.run, data):
            continue
        batch.messages.append(format_event(event.pk, kind, data))
    return batch


def _asked_of(user: Any, run: Run, data: dict[str, Any]) -> bool:
    """Whether ``user`` is the one a question asks: the run's launcher, or a member of the group
    it asks (the rule the question list of the API follows; others never see its text)."""
    if data.get("question") is None:
        return False
    question = Question.objects.filter(pk=data["question"]).only("answered_by").first()
    if question is None:
        return False
    if question.answered_by == "launcher":
        return bool(run.launched_by_id == user.pk)
    return bool(user.groups.filter(name=question.answered_by).exists())


def _latest_id() -> int:
    return RunEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


def _workflow_ids(slugs: set[str]) -> dict[str, int]:
    return dict(Workflow.objects.filter(slug__in=slugs).values_list("slug", "pk"))


_authenticate_async = read_only(token_authenticate)
_events_read_async = read_only(events_read)
_latest_id_async = read_only(_latest_id)
_workflow_ids_async = read_only(_workflow_ids)


async def stream(*, raw_token: str, after: int, flt: StreamFilter) -> AsyncIterator[str]:
    """The SSE body: events as they are written, a keepalive comment when there are none."""
    position = after
    # Tell the client how soon to reconnect; the first bytes also open the response at once.
    yield f"retry: {int(POLL_SECONDS * 3000)}\n\n"
    quiet_since = time.monotonic()
    while True:
        batch = await _events_read_async(raw_token=raw_token, after=position, flt=flt)
        if batch is None:
            yield 'event: end\ndata: {"reason":"the token no longer works"}\n\n'
            return
        for message in batch.messages:
            yield message
        if batch.messages:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= HEARTBEAT_SECONDS:
            yield ": keepalive\n\n"
            quiet_since = time.monotonic()
        if batch.position != position:
            position = batch.position
            continue  # more may be waiting behind a full batch
        await asyncio.sleep(POLL_SECONDS)


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
    if request.method != "GET":
        problem = Problem(405, "only GET streams events", headers={"Allow": "GET"})
        return problems.render(request, problem)
    raw_token = _bearer(request)
    context = await _authenticate_async(raw_token) if raw_token else None
    if context is None:
        return problems.render(
            request,
            Problem(
                401,
                "a valid API token is needed: Authorization: Bearer pw_…",
                headers={"WWW-Authenticate": 'Bearer realm="pandaweb"'},
            ),
        )
    verdict = ratelimit.check(
        ratelimit.default_counter(),
        f"token:{context.token_id}",
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
        stream(raw_token=raw_token, after=after, flt=flt), content_type="text/event-stream"
    )
    response["Cache-Control"] = "no-cache"
    # A reverse proxy must pass each event on as it comes, not when its buffer fills.
    response["X-Accel-Buffering"] = "no"
    return response
