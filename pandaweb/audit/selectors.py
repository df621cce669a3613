"""Reading the audit trail for people: the filtered, paged event list and a run's timeline.

Read-only. The events list pages by keyset on ``sequence`` (newest first), so a page stays the
same while new events are appended on top, and no page costs a COUNT of the whole table.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from typing import Any, Literal, TypeVar

from django.contrib.auth.models import User
from django.db.models import Model, Q, QuerySet
from django.http import Http404
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest
from pandaweb.audit import chain
from pandaweb.audit.models import AuditEvent
from pandaweb.core.models import Team
from sessions.models import Run, RunEvent, StepResult
from workflows.models import Workflow

PAGE_SIZE = 50

M = TypeVar("M", bound=Model)


@dataclass(frozen=True)
class EventFilters:
    """What the audit page narrows the trail to; empty values do not filter.

    ``date_from`` / ``date_to`` are whole days in the site's time zone (UTC by default), both
    included. ``actor`` is a username (case-insensitive, also matching the label kept at the time
    of the event, and "runner" / "system"); ``action`` is a prefix ("run." matches every run event).
    """

    date_from: date | None = None
    date_to: date | None = None
    actor: str = ""
    action: str = ""
    workflow: str = ""  # a workflow slug
    run_id: int | None = None
    team: str = ""  # a team slug

    @property
    def active(self) -> bool:
        return any(
            (
                self.date_from,
                self.date_to,
                self.actor,
                self.action,
                self.workflow,
                self.run_id,
                self.team,
            )
        )


def audit_events(
    filters: EventFilters, *, teams: frozenset[int] | None = None
) -> QuerySet[AuditEvent]:
    """Events matching ``filters`` among those of ``teams``, newest first.

    ``teams``: what the reader may see (``teams_where``); None is every event, the installation's
    own (people, tokens, the system: no team) among them, which only a global role sees.
    """
    events = AuditEvent.objects.select_related("actor").order_by("-sequence")
    if teams is not None:
        events = events.filter(team_id__in=teams)
    if filters.team:
        team_id = Team.objects.filter(slug=filters.team).values_list("pk", flat=True).first()
        if team_id is None:
            return events.none()
        events = events.filter(team_id=team_id)
    if filters.date_from is not None:
        events = events.filter(occurred_at__gte=_day_start(filters.date_from))
    if filters.date_to is not None:
        events = events.filter(occurred_at__lt=_day_start(filters.date_to + timedelta(days=1)))
    if filters.actor:
        events = events.filter(
            Q(actor_label__iexact=filters.actor) | Q(actor__username__iexact=filters.actor)
        )
    if filters.action:
        events = events.filter(action__startswith=filters.action)
    if filters.run_id is not None:
        events = events.filter(run_id=filters.run_id)
    if filters.workflow:
        workflow_id = (
            _in(Workflow.objects.filter(slug=filters.workflow), teams)
            .values_list("pk", flat=True)
            .first()
        )
        if workflow_id is None:
            return events.none()
        # The workflow's own events (edits, publications) and everything of its runs.
        events = events.filter(
            Q(object_type="workflow", object_id=str(workflow_id))
            | Q(run_id__in=Run.objects.filter(workflow_id=workflow_id).values("pk"))
        )
    return events


def _in(objects: QuerySet[M], teams: frozenset[int] | None, via: str = "team") -> QuerySet[M]:
    return objects if teams is None else objects.filter(**{f"{via}__in": teams})


def _day_start(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))


@dataclass(frozen=True)
class EventPage:
    events: list[AuditEvent]
    # Cursors for the neighbouring pages (None: there is none).
    newer_than: int | None
    older_than: int | None

    @property
    def is_newest(self) -> bool:
        return self.newer_than is None


def audit_page(
    events: QuerySet[AuditEvent],
    *,
    before: int | None = None,
    after: int | None = None,
    size: int = PAGE_SIZE,
) -> EventPage:
    """One page of ``events`` (ordered newest first): the newest page, the page of events older
    than sequence ``before``, or the page of events newer than ``after``."""
    if after is not None:
        chunk = list(events.filter(sequence__gt=after).order_by("sequence")[: size + 1])
        more_newer = len(chunk) > size
        rows = list(reversed(chunk[:size]))
        more_older = events.filter(sequence__lte=after).exists()
    else:
        scoped = events.filter(sequence__lt=before) if before is not None else events
        chunk = list(scoped.order_by("-sequence")[: size + 1])
        more_older = len(chunk) > size
        rows = chunk[:size]
        more_newer = before is not None and events.filter(sequence__gte=before).exists()
    if not rows:
        # A stale cursor: nothing on this side; offer the way back.
        return EventPage(events=[], newer_than=None, older_than=None)
    return EventPage(
        events=rows,
        newer_than=rows[0].sequence if more_newer else None,
        older_than=rows[-1].sequence if more_older else None,
    )


def known_actions(teams: frozenset[int] | None = None) -> list[str]:
    """Every action in the trail of ``teams`` (None: all of it), and each family prefix
    ("run.") before its members."""
    events = AuditEvent.objects.all()
    if teams is not None:
        events = events.filter(team_id__in=teams)
    actions = list(events.order_by("action").values_list("action", flat=True).distinct())
    families = sorted({action.split(".", 1)[0] + "." for action in actions if "." in action})
    return families + actions


def known_actors(teams: frozenset[int] | None = None) -> list[str]:
    """The usernames to suggest for the actor filter: everyone's for a reader of the whole
    trail; for a reader of some teams, only who acted in those teams' events."""
    if teams is None:
        return list(User.objects.order_by("username").values_list("username", flat=True))
    return list(
        AuditEvent.objects.filter(team_id__in=teams, actor__isnull=False)
        .order_by("actor__username")
        .values_list("actor__username", flat=True)
        .distinct()
    )


def workflow_choices(teams: frozenset[int] | None = None) -> QuerySet[Workflow]:
    return _in(Workflow.objects.only("name", "slug").order_by("name"), teams)


def team_choices(teams: frozenset[int] | None = None) -> QuerySet[Team]:
    return _in(Team.objects.only("name", "slug").order_by("name"), teams, via="pk")


def chain_head() -> AuditEvent | None:
    """The last event as stored (not verified)."""
    return AuditEvent.objects.order_by("-sequence").only("sequence", "hash", "occurred_at").first()


# The per-run timeline --------------------------------------------------------------------------

EntryKind = Literal["status", "step", "approval", "decision", "denial", "event"]


@dataclass
class TimelineEntry:
    """One thing in a run's history: a step, an approval request, a decision, a state change, an
    egress denial, or an audit event with nothing else behind it. ``audit`` is the audit event
    that recorded it, when there is one (its sequence and hash anchor the entry in the chain)."""

    kind: EntryKind
    at: datetime
    audit: AuditEvent | None = None
    step: StepResult | None = None
    approval: ApprovalRequest | None = None
    decision: ApprovalDecision | None = None
    run_event: RunEvent | None = None

    @property
    def sequence(self) -> int | None:
        return self.audit.sequence if self.audit is not None else None

    @property
    def audit_hash_ok(self) -> bool | None:
        """Whether the audit event's stored hash is the hash of its stored content and
        ``prev_hash`` (the link to the event before is checked by verifying the whole chain)."""
        if self.audit is None:
            return None
        return audit_event_hash_ok(self.audit)


def audit_event_hash_ok(event: AuditEvent) -> bool:
    try:
        return chain.event_hash(event.chain_fields(), event.prev_hash) == event.hash
    except (TypeError, ValueError, KeyError):
        return False


@dataclass
class RunTimeline:
    run: Run
    entries: list[TimelineEntry]
    steps: list[StepResult]
    approvals: list[ApprovalRequest]
    audit_events: list[AuditEvent]
    run_events: list[RunEvent] = field(default_factory=list)


def run_get(run_id: int, *, teams: frozenset[int] | None = None) -> Run:
    """The run, if it is in ``teams`` (None: any); another team's run is "no such run" (404)."""
    runs = _in(Run.objects.select_related("workflow", "version", "launched_by"), teams)
    try:
        return runs.get(pk=run_id)
    except Run.DoesNotExist:
        raise Http404("no such run") from None


def run_timeline(run: Run) -> RunTimeline:
    """Everything recorded about ``run``, joined and in time order.

    Steps, approval requests, decisions, state changes and egress denials each carry the audit
    event that recorded them; audit events with nothing else behind them (credentials used, the
    approved action started and completed, expiries, exports) are entries of their own.
    """
    audit_events = list(
        AuditEvent.objects.filter(run_id=run.pk).select_related("actor").order_by("sequence")
    )
    steps = list(run.step_results.order_by("index"))
    approvals = list(
        ApprovalRequest.objects.filter(run=run)
        .select_related("previous")
        .prefetch_related("decisions__reviewer")
        .order_by("created_at", "pk")
    )
    run_events = list(run.events.order_by("seq"))
    unmatched = _AuditPool(audit_events)
    entries: list[TimelineEntry] = []

    for event in run_events:
        if event.type == "status":
            to = event.payload.get("to", "")
            action = "run.launched" if not event.payload.get("from") else f"run.{to}"
            audit = unmatched.take(action)
            entries.append(TimelineEntry("status", event.created_at, audit=audit, run_event=event))
        elif event.type == "egress_denied":
            host = event.payload.get("host")
            audit = unmatched.take(
                "run.egress_denied",
                lambda a, host=host: bool(
                    (a.after or {}).get("host") == host and not (a.after or {}).get("quiet")
                ),
            )
            entries.append(TimelineEntry("denial", event.created_at, audit=audit, run_event=event))
    for step in steps:
        audit = unmatched.take("run.step_executed", lambda a, pk=step.pk: a.step_id == pk)
        entries.append(TimelineEntry("step", step.started_at, audit=audit, step=step))
    for approval in approvals:
        audit = unmatched.take("approval.requested", lambda a, pk=approval.pk: a.approval_id == pk)
        entries.append(
            TimelineEntry("approval", approval.created_at, audit=audit, approval=approval)
        )
        for decision in approval.decisions.all():
            audit = unmatched.take(
                "approval.decided",
                lambda a, d=decision: a.approval_id == d.request_id and a.actor_id == d.reviewer_id,
            )
            entries.append(
                TimelineEntry(
                    "decision",
                    decision.created_at,
                    audit=audit,
                    approval=approval,
                    decision=decision,
                )
            )
    for audit in unmatched.rest():
        entries.append(TimelineEntry("event", audit.occurred_at, audit=audit))

    entries.sort(key=_entry_order)
    return RunTimeline(
        run=run,
        entries=entries,
        steps=steps,
        approvals=approvals,
        audit_events=audit_events,
        run_events=run_events,
    )


_KIND_ORDER: dict[str, int] = {
    "status": 0, "step": 1, "approval": 2, "decision": 3, "denial": 4, "event": 5,
}  # fmt: skip


def _entry_order(entry: TimelineEntry) -> tuple[datetime, int, int]:
    # Same instant: the chain's order when both were recorded, else a fixed order of kinds.
    sequence = entry.sequence if entry.sequence is not None else 2**62
    return (entry.at, sequence, _KIND_ORDER[entry.kind])


class _AuditPool:
    """The run's audit events not yet attached to an entry, by action, in chain order."""

    def __init__(self, events: Sequence[AuditEvent]) -> None:
        self._by_action: dict[str, deque[AuditEvent]] = defaultdict(deque)
        for event in events:
            self._by_action[event.action].append(event)
        self._taken: set[int] = set()
        self._order = list(events)

    def take(self, action: str, matches: Any = None) -> AuditEvent | None:
        for event in self._by_action.get(action, ()):
            if event.pk in self._taken:
                continue
            if matches is None or matches(event):
                self._taken.add(event.pk)
                return event
        return None

    def rest(self) -> Iterable[AuditEvent]:
        return [event for event in self._order if event.pk not in self._taken]
