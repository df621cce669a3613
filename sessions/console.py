"""Reads of the operations console: the runs list (filters, search, keyset pages, sort, CSV),
what needs a person on the home page, failure triage and re-run eligibility.

Every list here is a keyset page: ``WHERE (key, id) < (last key, last id) ORDER BY key, id
LIMIT n+1``. The query count and the rows read per page stay the same with 100 runs or 10
million, and a run launched while someone pages does not shift the pages behind them.
"""

from __future__ import annotations

import base64
import binascii
import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Count, Max, Min, Q, QuerySet
from django.db.models.functions import TruncDate
from django.utils import timezone

from approvals.models import ApprovalRequest
from approvals.selectors import approvals_visible_to, question_count_for
from pandaweb.core.models import Team
from pandaweb.core.permissions import in_teams, teams_where
from pandaweb.core.roles import Capability
from sessions.models import Run, SavedRunView, ScratchSession, StepResult
from sessions.selectors import runs_visible_to
from sessions.services import runstate
from workflows.models import Workflow, WorkflowVersion

PAGE_SIZE = 50
EXPORT_LIMIT = 100_000
SEARCH_LONGEST = 200

# Sort key (as the address says it) -> model field. Only non-null fields: a keyset over NULLs
# needs a second ordering rule per database.
SORTS: dict[str, str] = {
    "created": "created_at",
    "status": "status",
    "steps": "steps_executed",
    "workflow": "workflow__name",
}
FILTER_KEYS = (
    "q", "team", "workflow", "version", "status", "by", "since", "until", "backend", "step",
)  # fmt: skip


@dataclass(frozen=True)
class RunFilter:
    """The runs list's filters, read from the address (every key optional)."""

    q: str = ""
    team: str = ""
    workflow: str = ""
    version: int | None = None
    status: str = ""
    by: str = ""
    since: date | None = None
    until: date | None = None
    backend: str = ""
    step: str = ""
    sort: str = "-created"
    errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_params(cls, params: Any, *, workflow: str = "") -> RunFilter:
        """Bad values are dropped with a message, never a 500 or a silently different list."""
        errors: dict[str, str] = {}

        def text(name: str, longest: int = 100) -> str:
            return str(params.get(name, "") or "").strip()[:longest]

        def day(name: str) -> date | None:
            raw = text(name, 10)
            if not raw:
                return None
            try:
                return date.fromisoformat(raw)
            except ValueError:
                errors[name] = "Use a date like 2026-12-01."
                return None

        version: int | None = None
        raw_version = text("version", 10)
        if raw_version:
            if raw_version.isdigit():
                version = int(raw_version)
            else:
                errors["version"] = "A version is a number."
        status = text("status", 24)
        if status and status not in Run.Status.values:
            errors["status"] = "No such status."
            status = ""
        sort = text("sort", 20) or "-created"
        if sort.lstrip("-") not in SORTS:
            errors["sort"] = "No such column."
            sort = "-created"
        return cls(
            q=text("q", SEARCH_LONGEST),
            team=text("team", 50),
            workflow=workflow or text("workflow", 50),
            version=version,
            status=status,
            by=text("by", 150),
            since=day("since"),
            until=day("until"),
            backend=text("backend", 20),
            step=text("step", 63),
            sort=sort,
            errors=errors,
        )

    @property
    def sort_key(self) -> str:
        return self.sort.lstrip("-")

    @property
    def descending(self) -> bool:
        return self.sort.startswith("-")

    @property
    def active(self) -> bool:
        return any(getattr(self, key) not in ("", None) for key in FILTER_KEYS)

    def params(self, **override: Any) -> dict[str, str]:
        """The address's query of this filter (empty values left out)."""
        values: dict[str, Any] = {key: getattr(self, key) for key in FILTER_KEYS}
        values["sort"] = "" if self.sort == "-created" else self.sort
        values.update(override)
        return {k: str(v) for k, v in values.items() if v not in ("", None)}

    def query(self, **override: Any) -> str:
        return urlencode(self.params(**override))

    def sort_query(self, key: str) -> str:
        """The address that sorts by ``key``: descending first, ascending on a second press."""
        target = key if self.sort == f"-{key}" else f"-{key}"
        return self.query(sort=target if target != "-created" else "")

    def apply(self, runs: QuerySet[Run]) -> QuerySet[Run]:
        if self.team:
            runs = runs.filter(team__slug=self.team)
        if self.workflow:
            runs = runs.filter(workflow__slug=self.workflow)
        if self.version is not None:
            runs = runs.filter(version__number=self.version)
        if self.status:
            runs = runs.filter(status=self.status)
        if self.by:
            runs = runs.filter(launched_by__username=self.by)
        if self.since:
            runs = runs.filter(created_at__gte=_start_of(self.since))
        if self.until:
            runs = runs.filter(created_at__lt=_start_of(self.until + timedelta(days=1)))
        if self.backend:
            runs = runs.filter(sandbox_backend=self.backend)
        if self.step:
            runs = runs.filter(failure_step=self.step)
        for word in self.q.lower().split()[:8]:
            runs = runs.filter(search_text__contains=word)
        return runs


def _start_of(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))


def _runs(user: Any) -> QuerySet[Run]:
    return (
        runs_visible_to(user)
        .select_related("workflow", "version", "launched_by")
        .defer("inputs", "outputs", "sandbox", "sandbox_facts", "search_text")
    )


def _ordered(runs: QuerySet[Run], flt: RunFilter) -> QuerySet[Run]:
    column = SORTS[flt.sort_key]
    if flt.descending:
        return runs.order_by(f"-{column}", "-id")
    return runs.order_by(column, "id")


def encode_cursor(value: Any, pk: int) -> str:
    raw = json.dumps([value.isoformat() if isinstance(value, datetime) else value, pk])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, sort_key: str) -> tuple[Any, int] | None:
    """The (key, id) after which the page starts, or None for a bad or foreign cursor."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value, pk = json.loads(raw)
    except (ValueError, binascii.Error, TypeError):
        return None
    if not isinstance(pk, int):
        return None
    if sort_key == "created":
        if not isinstance(value, str):
            return None
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    elif sort_key == "steps":
        if not isinstance(value, int):
            return None
    elif not isinstance(value, str):
        return None
    return value, pk


@dataclass(frozen=True)
class RunPage:
    runs: list[Run]
    next_cursor: str
    filter: RunFilter
    first: bool


def run_page(flt: RunFilter, *, user: Any, cursor: str = "", size: int = PAGE_SIZE) -> RunPage:
    """One page of the runs ``user`` may see: one query, whatever the number of runs."""
    runs = _ordered(flt.apply(_runs(user)), flt)
    column = SORTS[flt.sort_key]
    after = decode_cursor(cursor, flt.sort_key) if cursor else None
    if after is not None:
        value, pk = after
        if flt.descending:
            runs = runs.filter(Q(**{f"{column}__lt": value}) | Q(**{column: value, "id__lt": pk}))
        else:
            runs = runs.filter(Q(**{f"{column}__gt": value}) | Q(**{column: value, "id__gt": pk}))
    rows = list(runs[: size + 1])
    next_cursor = ""
    if len(rows) > size:
        rows = rows[:size]
        last = rows[-1]
        value = last.workflow.name if flt.sort_key == "workflow" else getattr(last, column)
        next_cursor = encode_cursor(value, last.pk)
    return RunPage(runs=rows, next_cursor=next_cursor, filter=flt, first=after is None)


def run_row(run_id: int, *, user: Any) -> Run | None:
    """One row of the list, for a live update (None for a run ``user`` may not see)."""
    return _runs(user).filter(pk=run_id).first()


def live_query(flt: RunFilter, page: RunPage) -> str:
    """The query of the list's websocket. On the first page, newest first, it carries the
    filters and the newest run shown (``newer_than``): a later run that matches the filters is
    put on top. Anywhere else only the visible rows change: a new run would break the
    keyset order people are paging through."""
    if not page.first or flt.sort != "-created":
        return ""
    newest = page.runs[0].pk if page.runs else 0
    return flt.query(newer_than=newest)


def run_matches(flt: RunFilter, run_id: int, *, user: Any) -> bool:
    return flt.apply(runs_visible_to(user).filter(pk=run_id)).exists()


# CSV export -----------------------------------------------------------------------------------

CSV_COLUMNS = [
    "run", "workflow", "version", "status", "launched_by", "created_at", "started_at",
    "finished_at", "steps", "backend", "failure_step", "failure_reason", "inputs", "outputs",
]  # fmt: skip
# A cell starting with one of these is a formula to a spreadsheet ("=HYPERLINK(...)" in an
# output the portal wrote): prefixed with a quote so it is shown, never evaluated.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "|", "%")


def csv_cell(value: Any) -> str:
    text = "" if value is None else str(value)
    if text.startswith(_FORMULA_STARTS):
        return "'" + text
    return text


def run_csv_rows(flt: RunFilter, *, user: Any) -> Iterator[str]:
    """The whole filtered list of the runs ``user`` may see as CSV lines (header first), in the
    list's order."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)

    def line(values: list[Any]) -> str:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow([csv_cell(v) for v in values])
        return buffer.getvalue()

    yield line(CSV_COLUMNS)
    every = runs_visible_to(user).select_related("workflow", "version", "launched_by")
    runs = _ordered(flt.apply(every), flt)
    for run in runs[:EXPORT_LIMIT].iterator(chunk_size=1000):
        yield line(
            [
                run.pk,
                run.workflow.slug,
                run.version.number,
                run.status,
                run.launched_by.get_username(),
                run.created_at.isoformat(),
                run.started_at.isoformat() if run.started_at else "",
                run.finished_at.isoformat() if run.finished_at else "",
                run.steps_executed,
                run.sandbox_backend,
                run.failure_step,
                run.failure_reason,
                json.dumps(run.inputs, default=str, sort_keys=True),
                json.dumps(run.outputs, default=str, sort_keys=True),
            ]
        )


# Filter choices and saved views ---------------------------------------------------------------


def filter_choices(user: Any) -> dict[str, Any]:
    """What the filter form offers ``user``: a fixed number of small queries."""
    workflows = in_teams(Workflow.objects.all(), user, Capability.VIEW_RUNS)
    teams = teams_where(user, Capability.VIEW_RUNS)
    # Someone who sees some teams' runs is offered the people who launched those runs only.
    launchers = (
        get_user_model().objects.filter(is_active=True)
        if teams is None
        else get_user_model().objects.filter(
            pk__in=Run.objects.filter(team__in=teams).values("launched_by")
        )
    )
    return {
        "teams": list(
            (Team.objects.all() if teams is None else Team.objects.filter(pk__in=teams))
            .order_by("name")
            .values_list("slug", "name")[:500]
        ),
        "workflows": list(workflows.order_by("name").values_list("slug", "name")[:500]),
        "statuses": Run.Status.choices,
        "launchers": list(launchers.order_by("username").values_list("username", flat=True)[:500]),
    }


def saved_views(user: Any) -> QuerySet[SavedRunView]:
    return SavedRunView.objects.filter(user=user).order_by("name")


# Home: what needs me --------------------------------------------------------------------------

WAITING = (
    Run.Status.QUEUED,
    Run.Status.STARTING,
    Run.Status.RUNNING,
    Run.Status.AWAITING_APPROVAL,
    Run.Status.AWAITING_ANSWER,
)


@dataclass(frozen=True)
class FailureGroup:
    workflow_slug: str
    workflow_name: str
    step: str
    count: int
    last_run_id: int


@dataclass(frozen=True)
class StoppedRun:
    """A run of the person's that ended without its gated action being done, and why."""

    run: Run
    outcome: str  # "expired", "rejected" or "refused"
    why: str


def _stopped(approval: ApprovalRequest) -> StoppedRun | None:
    if approval.refused_at is not None:
        return StoppedRun(approval.run, "refused", f"The portal refused: {approval.action_result}")
    if approval.status == ApprovalRequest.Status.REJECTED:
        return StoppedRun(approval.run, "rejected", f"Approval {approval.reason}")
    if approval.status == ApprovalRequest.Status.EXPIRED:
        return StoppedRun(approval.run, "expired", "Nobody decided its approval before it expired.")
    return None


def _stopped_runs(user: Any, limit: int) -> list[StoppedRun]:
    """The person's finished runs whose approval expired or was rejected, or whose approved
    action the portal refused, that they have not seen since (opened, or dismissed here)."""
    ended = (
        in_teams(ApprovalRequest.objects.all(), user, Capability.VIEW_RUNS, via="run__team")
        .filter(run__launched_by=user, run__status__in=Run.FINAL)
        .filter(Q(status__in=["expired", "rejected"]) | Q(refused_at__isnull=False))
        .exclude(run__seen_marks__user=user)
        .select_related("run__workflow")
        .order_by("-run__finished_at", "-run_id", "-pk")
    )
    stopped: dict[int, StoppedRun] = {}
    for approval in ended[: limit * 2]:  # a run's newest such request says why it stopped
        found = _stopped(approval)
        if found is not None and approval.run_id not in stopped:
            stopped[approval.run_id] = found
    return list(stopped.values())[:limit]


def my_runs(user: Any, *, limit: int = 10) -> dict[str, list[Any]]:
    """The person's own runs that are in flight, failed in the last day, or need them; and
    those that stopped at their approval or at the portal's refusal, until they have seen them
    (these stay whatever their age: nothing else tells the launcher the payment was not made)."""
    since = timezone.now() - timedelta(days=1)
    mine = _runs(user).filter(launched_by=user)
    stopped = _stopped_runs(user, limit)
    return {
        "stopped": stopped,
        "reconcile": list(mine.filter(status=Run.Status.NEEDS_RECONCILIATION)[:limit]),
        "waiting": list(mine.filter(status__in=WAITING).order_by("-created_at", "-id")[:limit]),
        "failed": list(
            mine.filter(status=Run.Status.FAILED, finished_at__gte=since)
            .exclude(pk__in=[s.run.pk for s in stopped])
            .order_by("-finished_at", "-id")[:limit]
        ),
    }


def failures_today(*, user: Any, limit: int = 20) -> list[FailureGroup]:
    """Today's failed runs ``user`` may see grouped by workflow and failing step, most frequent
    first."""
    start = _start_of(timezone.localdate())
    rows = (
        runs_visible_to(user)
        .filter(status=Run.Status.FAILED, finished_at__gte=start)
        .values("workflow__slug", "workflow__name", "failure_step")
        .annotate(count=Count("id"), last=Max("id"))
        .order_by("-count", "workflow__name", "failure_step")[:limit]
    )
    return [
        FailureGroup(
            workflow_slug=row["workflow__slug"],
            workflow_name=row["workflow__name"],
            step=row["failure_step"],
            count=row["count"],
            last_run_id=row["last"],
        )
        for row in rows
    ]


def needs_counts(user: Any) -> dict[str, int]:
    """The live numbers on the home page (one query per number, whatever the data): those of
    the teams ``user`` may see, and the questions runs ask them (the navigation badge counts the
    same)."""

    start = _start_of(timezone.localdate())
    runs = runs_visible_to(user)
    return {
        "questions": question_count_for(user),
        "approvals": approvals_visible_to(user)
        .filter(status=ApprovalRequest.Status.PENDING)
        .count(),
        "reconcile": runs.filter(status=Run.Status.NEEDS_RECONCILIATION).count(),
        "failed_today": runs.filter(status=Run.Status.FAILED, finished_at__gte=start).count(),
        "active": runs.filter(status__in=WAITING).count(),
    }


def approvals_for(user: Any, *, limit: int = 10) -> list[Any]:
    """Pending approvals this person could decide (of their teams' runs, not of their own),
    soonest to expire."""

    decidable = in_teams(
        ApprovalRequest.objects.all(), user, Capability.DECIDE_APPROVALS, via="run__team"
    )
    return list(
        decidable.filter(status=ApprovalRequest.Status.PENDING)
        .exclude(run__launched_by=user)
        .exclude(decisions__reviewer=user)
        .select_related("run__workflow", "run__launched_by")
        .order_by("expires_at", "pk")[:limit]
    )


# Failure triage -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TriageGroup:
    workflow_slug: str
    workflow_name: str
    step: str
    reason: str
    count: int
    first_at: datetime
    last_at: datetime
    first_run_id: int
    last_run_id: int
    per_day: list[int]


def _reason_head(reason: str) -> str:
    """A failure reason without its run-specific tail, so equal failures group together."""
    head = (reason or "").strip().splitlines()[0] if reason else ""
    return head[:120]


def failure_groups(*, user: Any, days: int = 14, limit: int = 50) -> list[TriageGroup]:
    """Failed runs of the last ``days`` grouped by (workflow, step, reason), the most frequent
    first, each with a count per day (oldest first) for a small bar chart."""
    since = _start_of(timezone.localdate() - timedelta(days=days - 1))
    rows = (
        runs_visible_to(user)
        .filter(status=Run.Status.FAILED, finished_at__gte=since)
        .values("workflow__slug", "workflow__name", "failure_step", "failure_reason")
        .annotate(
            count=Count("id"),
            first_at=Min("finished_at"),
            last_at=Max("finished_at"),
            first_id=Min("id"),
            last_id=Max("id"),
        )
        .order_by("-count")[:2000]
    )
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in rows:
        key = (row["workflow__slug"], row["failure_step"], _reason_head(row["failure_reason"]))
        group = groups.setdefault(
            key,
            {
                "workflow_name": row["workflow__name"],
                "count": 0,
                "first_at": row["first_at"],
                "last_at": row["last_at"],
                "first_id": row["first_id"],
                "last_id": row["last_id"],
            },
        )
        group["count"] += row["count"]
        if row["first_at"] < group["first_at"]:
            group["first_at"], group["first_id"] = row["first_at"], row["first_id"]
        if row["last_at"] > group["last_at"]:
            group["last_at"], group["last_id"] = row["last_at"], row["last_id"]
    ranked = sorted(groups.items(), key=lambda item: -item[1]["count"])[:limit]
    per_day = _per_day(runs_visible_to(user), since, days, [key for key, _ in ranked])
    return [
        TriageGroup(
            workflow_slug=key[0],
            workflow_name=group["workflow_name"],
            step=key[1],
            reason=key[2],
            count=group["count"],
            first_at=group["first_at"],
            last_at=group["last_at"],
            first_run_id=group["first_id"],
            last_run_id=group["last_id"],
            per_day=per_day.get(key, [0] * days),
        )
        for key, group in ranked
    ]


def _per_day(
    runs: QuerySet[Run], since: datetime, days: int, keys: list[tuple[str, str, str]]
) -> dict[tuple[str, str, str], list[int]]:
    """Failures per day of each group: counted by the database per (workflow, step, reason,
    day), so the rows read grow with the days and distinct reasons, not with the runs."""
    wanted = set(keys)
    counts: dict[tuple[str, str, str], list[int]] = {key: [0] * days for key in keys}
    if not keys:
        return counts
    rows = (
        runs.filter(
            status=Run.Status.FAILED,
            finished_at__gte=since,
            workflow__slug__in={key[0] for key in keys},
        )
        .annotate(day=TruncDate("finished_at"))
        .values_list("workflow__slug", "failure_step", "failure_reason", "day")
        .annotate(n=Count("id"))
        .order_by()
    )
    for slug, step, reason, day, n in rows:
        key = (slug, step, _reason_head(reason))
        if key not in wanted or day is None:
            continue
        offset = (day - since.date()).days
        if 0 <= offset < days:
            counts[key][offset] += n
    return counts


def triage_runs(*, user: Any, workflow: str, step: str, reason: str, limit: int = 20) -> list[Run]:
    """The latest failed runs of one group ``user`` may see, for picking two to compare."""
    runs = _runs(user).filter(status=Run.Status.FAILED, workflow__slug=workflow, failure_step=step)
    if reason:
        runs = runs.filter(failure_reason__startswith=reason)
    return list(runs.order_by("-finished_at", "-id")[:limit])


def failing_step(run: Run) -> StepResult | None:
    """The step the run failed on: the one its failure names, else its last non-successful
    result, else its last step."""
    steps = run.step_results.order_by("-index")
    if run.failure_step:
        named = steps.filter(step_id=run.failure_step).first()
        if named is not None:
            return named
    return steps.exclude(status=StepResult.Status.SUCCEEDED).first() or steps.first()


# Capacity (the system page) ------------------------------------------------------------------


@dataclass(frozen=True)
class WorkflowQueue:
    """One workflow's queue on the system page."""

    workflow: Workflow
    waiting: int
    occupying: int
    limit: int
    oldest_run_id: int
    oldest_since: datetime


@dataclass(frozen=True)
class Capacity:
    queued: int
    oldest_queued: Run | None
    queues: list[WorkflowQueue]
    active: int
    sandboxes_by_host: list[tuple[str, int]]
    # Scratch sessions' browsers (authoring on a live page), and how many may be open at once.
    scratch_open: int
    scratch_max: int
    expiring: list[Any]
    retention_days: int
    pruned_runs: int


def capacity(*, expiring_within: timedelta = timedelta(minutes=15)) -> Capacity:
    """Queue depth, the oldest queued run, live sandboxes per host and approvals about to
    expire: a fixed number of queries."""

    queued = Run.objects.filter(status=Run.Status.QUEUED)
    hosts: dict[str, int] = {}
    live = Run.objects.filter(status__in=Run.ACTIVE).exclude(sandbox=None)
    for record in live.values_list("sandbox", flat=True)[:5000]:
        host = str((record or {}).get("host") or "unknown")
        hosts[host] = hosts.get(host, 0) + 1
    soon = timezone.now() + expiring_within
    return Capacity(
        queues=workflow_queues(),
        queued=queued.count(),
        oldest_queued=queued.select_related("workflow").order_by("created_at", "id").first(),
        active=Run.objects.filter(status__in=Run.ACTIVE).count(),
        sandboxes_by_host=sorted(hosts.items()),
        scratch_open=ScratchSession.objects.filter(status__in=ScratchSession.OPEN).count(),
        scratch_max=settings.SCRATCH_SESSIONS_MAX,
        expiring=list(
            ApprovalRequest.objects.filter(
                status=ApprovalRequest.Status.PENDING, expires_at__lte=soon
            )
            .select_related("run__workflow")
            .order_by("expires_at", "pk")[:20]
        ),
        retention_days=settings.RUN_FILES_RETENTION_DAYS,
        pruned_runs=Run.objects.exclude(files_pruned_at=None).count(),
    )


def workflow_queues(*, limit: int = 20) -> list[WorkflowQueue]:
    """The workflows with runs waiting for a slot, longest queue first: three queries."""

    rows = list(
        Run.objects.filter(runstate.WAITING)
        .values("workflow")
        .annotate(waiting=Count("id"), oldest_id=Min("id"), oldest_since=Min("created_at"))
        .order_by("-waiting", "oldest_since")[:limit]
    )
    ids = [row["workflow"] for row in rows]
    occupying = dict(
        Run.objects.filter(runstate.OCCUPYING, workflow_id__in=ids)
        .values("workflow")
        .annotate(n=Count("id"))
        .values_list("workflow", "n")
    )
    workflows = Workflow.objects.in_bulk(ids)
    limits: dict[int, int] = {}
    published = WorkflowVersion.objects.filter(
        workflow_id__in=ids, status=WorkflowVersion.Status.PUBLISHED
    ).order_by("workflow_id", "-number")
    for version in published:
        limits.setdefault(version.workflow_id, version.settings_model.max_concurrent_runs)
    return [
        WorkflowQueue(
            workflow=workflows[row["workflow"]],
            waiting=row["waiting"],
            occupying=occupying.get(row["workflow"], 0),
            limit=limits.get(row["workflow"], workflows[row["workflow"]].max_concurrent_runs),
            oldest_run_id=row["oldest_id"],
            oldest_since=row["oldest_since"],
        )
        for row in rows
    ]


# Evidence viewer -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepEvidence:
    previous: int | None
    next: int | None
    extracted: list[tuple[str, Any]]
    approvals: list[Any]


def step_evidence(run: Run, step: StepResult) -> StepEvidence:
    """What the step page shows around a step: its neighbours, the values an extract step read
    (as the run's outputs hold them) and who approved it."""

    indexes = run.step_results.values_list("index", flat=True)
    previous = indexes.filter(index__lt=step.index).order_by("-index").first()
    following = indexes.filter(index__gt=step.index).order_by("index").first()
    extracted: list[tuple[str, Any]] = []
    if step.step_type == "extract":
        steps = (run.version.document or {}).get("steps", [])
        spec = next((s for s in steps if s.get("id") == step.step_id), None) or {}
        for item in spec.get("fields", []):
            name = str(item.get("name", ""))
            extracted.append((name, run.outputs.get(name, "")))
    approvals = list(
        ApprovalRequest.objects.filter(run=run, step_index=step.index)
        .prefetch_related("decisions__reviewer")
        .order_by("pk")
    )
    return StepEvidence(previous=previous, next=following, extracted=extracted, approvals=approvals)
