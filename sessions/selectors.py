from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import QuerySet
from django.http import Http404

from sessions.models import Run, RunEvent, SessionTemplate, StepResult
from workflows.models import Workflow, WorkflowVersion
from workflows.schema import SessionSpec, StepBase, describe_step


def run_list(*, limit: int = 100) -> QuerySet[Run]:
    return Run.objects.select_related("workflow", "version", "launched_by").order_by("-created_at")[
        :limit
    ]


def run_get(run_id: int) -> Run:
    """The run or 404. Every role that may see runs may see every run of the team."""
    try:
        return Run.objects.select_related(
            "workflow", "version", "launched_by", "session_template__requested_by"
        ).get(pk=run_id)
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
