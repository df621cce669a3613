from __future__ import annotations

from django.db.models import QuerySet
from django.http import Http404

from sessions.models import Run, RunEvent, StepResult


def run_list(*, limit: int = 100) -> QuerySet[Run]:
    return Run.objects.select_related("workflow", "version", "launched_by").order_by("-created_at")[
        :limit
    ]


def run_get(run_id: int) -> Run:
    """The run or 404. Every role that may see runs may see every run of the team."""
    try:
        return Run.objects.select_related("workflow", "version", "launched_by").get(pk=run_id)
    except Run.DoesNotExist:
        raise Http404("no such run") from None


def run_steps(run: Run) -> QuerySet[StepResult]:
    return run.step_results.order_by("index")


def run_events_after(run_id: int, seq: int, *, limit: int = 200) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id=run_id, seq__gt=seq).order_by("seq")[:limit])


def run_denials(run: Run) -> QuerySet[RunEvent]:
    return run.events.filter(type="egress_denied").order_by("seq")
