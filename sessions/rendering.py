"""HTML fragments of a run page, for the first render and for live updates alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from django.http import HttpRequest
from django.template.loader import render_to_string

from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability
from sessions import selectors
from sessions.models import Run, RunEvent, StepResult


class Fragment(TypedDict):
    target: str
    html: str


def side_html(run: Run) -> str:
    return render_to_string(
        "sessions/partials/_run_side.html", {"run": run, "artifacts": run.artifacts.all()}
    )


@dataclass(frozen=True)
class Viewer:
    """What the person looking at a run page may do there (the header's buttons and links)."""

    can_cancel: bool = False
    can_reconcile: bool = False
    can_audit: bool = False

    @classmethod
    def of(cls, user: Any) -> Viewer:
        if user is None:
            return cls()
        return cls(
            can_cancel=user_can(user, Capability.LAUNCH_RUNS),
            can_reconcile=user_can(user, Capability.DECIDE_APPROVALS),
            can_audit=user_can(user, Capability.VIEW_AUDIT),
        )


def header_html(run: Run, viewer: Viewer, request: HttpRequest | None = None) -> str:
    """The run's header. Its forms carry a CSRF token only when ``request`` is given (the first
    render); after a live update they post through htmx, which sends the page's token."""
    from approvals.models import ApprovalRequest
    from sessions.runner import STALE_SESSION

    pending = run.approvals.filter(status=ApprovalRequest.Status.PENDING).first()
    context = {
        "run": run,
        "can_cancel": viewer.can_cancel,
        "can_reconcile": viewer.can_reconcile,
        "can_audit": viewer.can_audit,
        "pending_approval": pending,
        "session_event": None if run.session_template_id else selectors.run_session_event(run),
        "session_stale": run.failure_reason == STALE_SESSION,
    }
    return render_to_string("sessions/partials/_run_header.html", context, request=request)


def step_html(step: StepResult) -> str:
    return render_to_string("sessions/partials/_step.html", {"step": step, "run": step.run})


def denial_html(event: RunEvent) -> str:
    return render_to_string("sessions/partials/_denial.html", {"event": event})


def fragments_for(event: RunEvent, viewer: Viewer) -> list[Fragment]:
    """What changes on the run page when ``event`` happens (idempotent by element id)."""
    run = Run.objects.select_related(
        "workflow", "version", "launched_by", "session_template__requested_by"
    ).get(pk=event.run_id)
    fragments: list[Fragment] = [
        {
            "target": "#run-header",
            "html": header_html(run, viewer),
        },
        {"target": "#run-side", "html": side_html(run)},
    ]
    if event.type == "step":
        step = (
            StepResult.objects.select_related("run")
            .filter(pk=event.payload.get("step_result"))
            .first()
        )
        if step is not None:
            fragments.append({"target": "#timeline", "html": step_html(step)})
    elif event.type == "egress_denied":
        fragments.append({"target": "#denials", "html": denial_html(event)})
    return fragments


def message_for(event: RunEvent, viewer: Viewer) -> dict[str, Any]:
    run_final = Run.objects.filter(pk=event.run_id, status__in=Run.FINAL).exists()
    fragments = fragments_for(event, viewer)
    return {"seq": event.seq, "fragments": fragments, "final": run_final}
