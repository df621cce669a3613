from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet
from django.http import Http404

from pandaweb.core.permissions import in_teams
from pandaweb.core.roles import Capability
from sessions.engine.steps.base import StepBase
from sessions.engine.steps.language import REFERENCE, TEMPLATE
from sessions.models import Run, RunEvent, SessionTemplate, StepResult
from workflows.models import Workflow, WorkflowVersion
from workflows.schema import STEP_ADAPTER, SessionSpec, describe_step


def runs_visible_to(user: AbstractBaseUser | AnonymousUser) -> QuerySet[Run]:
    """The runs ``user`` may see: those of the teams where they may view runs (every run for a
    global role). Every list, search and count of runs starts here."""
    return in_teams(Run.objects.all(), user, Capability.VIEW_RUNS)


def run_get(run_id: int, *, user: AbstractBaseUser | AnonymousUser) -> Run:
    """The run or 404. Another team's run is "no such run" too, so its id tells a stranger
    nothing."""
    try:
        return (
            runs_visible_to(user)
            .select_related("workflow", "version", "launched_by", "session_template__requested_by")
            .get(pk=run_id)
        )
    except Run.DoesNotExist:
        raise Http404("no such run") from None


def run_steps(run: Run) -> QuerySet[StepResult]:
    return run.step_results.order_by("index")


def run_events_after(run_id: int, seq: int, *, limit: int = 200) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id=run_id, seq__gt=seq).order_by("seq")[:limit])


def run_denials(run: Run) -> QuerySet[RunEvent]:
    return run.events.filter(type="egress_denied").order_by("seq")


def session_template_pick(
    *, version_id: int, backend: str, hosts: tuple[str, ...] | None = None
) -> SessionTemplate | None:
    """The template a run of the version forks: the ready one; else the newest that is not
    retired (baking, stale or failed: the run waits or fails); else None (never baked).
    ``hosts`` limits it to templates usable on a machine ('' for portable ones)."""
    live = (
        SessionTemplate.objects.filter(version_id=version_id, backend=backend)
        .exclude(status=SessionTemplate.Status.RETIRED)
        .select_related("requested_by")
    )
    if hosts is not None:
        live = live.filter(host__in=hosts)
    ready = live.filter(status=SessionTemplate.Status.READY).order_by("-pk").first()
    return ready or live.order_by("-pk").first()


def run_session_event(run: Run) -> RunEvent | None:
    """The run's latest word on its session template (e.g. that it is being baked)."""
    return run.events.filter(type="session_template").order_by("-seq").first()


@dataclass(frozen=True)
class SessionPanel:
    """The session template of a workflow's latest published version, as its page shows it."""

    version: WorkflowVersion
    session: SessionSpec
    backend: str
    template: SessionTemplate | None

    @property
    def steps(self) -> list[str]:
        sentences = []
        for step in self.session.steps:
            assert isinstance(step, StepBase)
            sentences.append(describe_step(step))
        return sentences

    @property
    def rebake_due_at(self) -> datetime | None:
        template = self.template
        if template is None or template.status != SessionTemplate.Status.READY:
            return None
        if template.baked_at is None:
            return None
        return template.baked_at + timedelta(hours=self.session.rebake_every_hours)


def session_template_panel(workflow: Workflow, *, backend: str) -> SessionPanel | None:
    """None when the latest published version declares no session template."""
    version = (
        workflow.versions.filter(status=WorkflowVersion.Status.PUBLISHED)
        .order_by("-number")
        .first()
    )
    data = (version.document or {}).get("session") if version is not None else None
    if version is None or not data:
        return None
    return SessionPanel(
        version=version,
        session=SessionSpec.model_validate(data),
        backend=backend,
        template=session_template_pick(version_id=version.pk, backend=backend),
    )


@dataclass(frozen=True)
class RunFilters:
    """What the API's run list narrows to; empty values do not filter. ``inputs`` / ``outputs``
    hold exact values by name (launch values are stored as strings, booleans as booleans)."""

    workflow: str = ""  # slug
    statuses: tuple[str, ...] = ()
    launched_by: str = ""  # username
    created_from: datetime | None = None
    created_to: datetime | None = None
    inputs: tuple[tuple[str, Any], ...] = ()
    outputs: tuple[tuple[str, Any], ...] = ()


def run_keyset(
    filters: RunFilters,
    *,
    user: AbstractBaseUser | AnonymousUser,
    before_id: int | None,
    limit: int,
) -> list[Run]:
    """Up to ``limit`` runs ``user`` may see matching ``filters``, newest first, with ids below
    ``before_id``.

    Keyset pagination on the primary key: a page never shifts when runs are launched meanwhile,
    and no page counts the table. Names in ``inputs`` / ``outputs`` must be identifiers (the
    caller checks): they become JSON key lookups.
    """
    runs = (
        runs_visible_to(user)
        .select_related("workflow", "version", "launched_by")
        .defer("sandbox", "sandbox_facts")
    )
    if filters.workflow:
        runs = runs.filter(workflow__slug=filters.workflow)
    if filters.statuses:
        runs = runs.filter(status__in=filters.statuses)
    if filters.launched_by:
        runs = runs.filter(launched_by__username__iexact=filters.launched_by)
    if filters.created_from is not None:
        runs = runs.filter(created_at__gte=filters.created_from)
    if filters.created_to is not None:
        runs = runs.filter(created_at__lt=filters.created_to)
    for name, value in filters.inputs:
        runs = runs.filter(**{f"inputs__{name}": value})
    for name, value in filters.outputs:
        runs = runs.filter(**{f"outputs__{name}": value})
    if before_id is not None:
        runs = runs.filter(pk__lt=before_id)
    return list(runs.order_by("-pk")[:limit])


def run_live_steps(run: Run) -> tuple[list[str], int]:
    """The run's steps in words (parameters filled in) and the index of the one running now
    (or next): what the live view's header and list start from, before the worker's first
    word."""
    inputs = run.inputs or {}

    def filled(match: re.Match[str]) -> str:
        reference = REFERENCE.match(match.group("ref"))
        if reference is None:
            return match.group(0)
        if reference.group("ns") == "params" and reference.group("name") in inputs:
            return str(inputs[reference.group("name")])
        return "a secret" if reference.group("ns") == "secrets" else match.group(0)

    sentences = [
        TEMPLATE.sub(filled, describe_step(STEP_ADAPTER.validate_python(step)))
        for step in (run.version.document or {}).get("steps", [])
    ]
    last = run.step_results.order_by("-index").values_list("index", flat=True).first()
    current = run.start_index if last is None else last + 1
    return sentences, min(current, max(len(sentences) - 1, 0))
