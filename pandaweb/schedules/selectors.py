from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from django.utils import timezone

from approvals.models import ApprovalRequest
from pandaweb.core.permissions import in_teams
from pandaweb.core.roles import Capability
from pandaweb.schedules import cron
from pandaweb.schedules.models import Batch, BatchRow, Schedule
from sessions.models import Run
from workflows.models import Workflow
from workflows.selectors import Person


def schedule_get(schedule_id: int, *, user: Person) -> Schedule:
    """The schedule, 404 also when its workflow is another team's."""
    schedules = in_teams(
        Schedule.objects.all(), user, Capability.VIEW_WORKFLOWS, via="workflow__team"
    )
    return get_object_or_404(
        schedules.select_related("workflow", "owner", "last_run"), pk=schedule_id
    )


def schedule_list(*, user: Person, workflow_slug: str = "") -> QuerySet[Schedule]:
    """The schedules (or one workflow's) of the teams where ``user`` sees workflows, by workflow
    and name."""
    schedules = in_teams(
        Schedule.objects.all(), user, Capability.VIEW_WORKFLOWS, via="workflow__team"
    ).select_related("workflow", "owner", "last_run")
    if workflow_slug:
        schedules = schedules.filter(workflow__slug=workflow_slug)
    return schedules.order_by("workflow__slug", "name", "pk")


def workflow_schedules(workflow: Workflow) -> QuerySet[Schedule]:
    return workflow.schedules.select_related("owner", "last_run").order_by("name", "pk")


def schedule_in_words(schedule: Schedule) -> str:
    return cron.describe(schedule.cron, schedule.timezone)


def schedule_next_times(schedule: Schedule, count: int = 5) -> list[datetime]:
    if schedule.paused:
        return []
    return cron.next_times(schedule.cron, schedule.timezone, timezone.now(), count)


def batch_get(batch_id: int, *, user: Person) -> Batch:
    """The batch, 404 also when its workflow is another team's (its rows are runs: VIEW_RUNS)."""
    batches = in_teams(Batch.objects.all(), user, Capability.VIEW_RUNS, via="workflow__team")
    return get_object_or_404(batches.select_related("workflow", "created_by"), pk=batch_id)


def workflow_batches(workflow: Workflow, limit: int = 5) -> list[Batch]:
    return list(workflow.batches.select_related("created_by")[:limit])


@dataclass(frozen=True)
class RowView:
    row: BatchRow
    cells: list[Any]
    status: str
    label: str
    approval_id: int | None


@dataclass(frozen=True)
class BatchProgress:
    rows: list[RowView]
    counts: dict[str, int]
    total: int
    settled: int

    @property
    def done(self) -> bool:
        return self.settled == self.total

    @property
    def percent(self) -> int:
        return round(100 * self.settled / self.total) if self.total else 100


_SETTLED = frozenset(Run.FINAL) | {
    Run.Status.NEEDS_RECONCILIATION,
    BatchRow.Status.REFUSED,
    BatchRow.Status.INVALID,
}


def batch_progress(batch: Batch) -> BatchProgress:
    """Each row with the status people care about (its run's, or waiting / could not launch),
    and the pending approval to review one by one. Three queries whatever the size."""
    rows = list(batch.rows.select_related("run"))
    waiting_runs = [
        r.run_id for r in rows if r.run and r.run.status == Run.Status.AWAITING_APPROVAL
    ]
    pending = dict(
        ApprovalRequest.objects.filter(
            run_id__in=waiting_runs, status=ApprovalRequest.Status.PENDING
        ).values_list("run_id", "pk")
    )
    views: list[RowView] = []
    for row in rows:
        if row.run is not None:
            status, label = row.run.status, row.run.get_status_display()
        else:
            status, label = row.status, row.get_status_display()
        cells = [row.inputs.get(c) for c in batch.columns]
        approval_id = pending.get(row.run_id) if row.run_id else None
        views.append(RowView(row, cells, status, label, approval_id))
    counts: dict[str, Any] = Counter(v.label for v in views)
    settled = sum(1 for v in views if v.status in _SETTLED)
    return BatchProgress(views, dict(counts), len(views), settled)
