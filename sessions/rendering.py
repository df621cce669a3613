"""HTML fragments of a run page, for the first render and for live updates alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from django.contrib.auth.models import User
from django.http import HttpRequest
from django.template.loader import render_to_string

from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability
from sessions import selectors
from sessions.models import Run, RunEvent, StepResult
from workflows.schema import ask_audience


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
    can_see_approvals: bool = False
    user_id: int | None = None

    @classmethod
    def of(cls, user: Any) -> Viewer:
        if user is None:
            return cls()
        return cls(
            can_cancel=user_can(user, Capability.LAUNCH_RUNS),
            can_reconcile=user_can(user, Capability.DECIDE_APPROVALS),
            can_audit=user_can(user, Capability.VIEW_AUDIT),
            can_see_approvals=user_can(user, Capability.VIEW_APPROVALS),
            user_id=getattr(user, "pk", None),
        )


def header_html(run: Run, viewer: Viewer, request: HttpRequest | None = None) -> str:
    """The run's header. Its forms carry a CSRF token only when ``request`` is given (the first
    render); after a live update they post through htmx, which sends the page's token."""
    from approvals.models import ApprovalRequest
    from approvals.questions import question_refusal
    from approvals.selectors import question_pending
    from sessions.runner import STALE_SESSION

    pending = run.approvals.filter(status=ApprovalRequest.Status.PENDING).first()
    question = question_pending(run) if run.status == Run.Status.AWAITING_ANSWER else None
    refusal = ""
    if question is not None:
        user = User.objects.filter(pk=viewer.user_id).first() if viewer.user_id else None
        refusal = (question_refusal(user, question) or "") if user else "sign in to answer"
    context = {
        "run": run,
        "can_cancel": viewer.can_cancel,
        # The launcher never settles their own run's uncertain action (see run_reconcile).
        "can_reconcile": viewer.can_reconcile and run.launched_by_id != viewer.user_id,
        "can_audit": viewer.can_audit,
        "pending_approval": pending,
        # The launcher follows their own run's request read-only; others need the queue.
        "can_open_approval": viewer.can_see_approvals
        or (viewer.user_id is not None and viewer.user_id == run.launched_by_id),
        "session_event": None if run.session_template_id else selectors.run_session_event(run),
        "session_stale": run.failure_reason == STALE_SESSION,
        "pending_question": question,
        "question_refusal": refusal,
        "question_audience": ask_audience(question.answered_by) if question else "",
    }
    return render_to_string("sessions/partials/_run_header.html", context, request=request)


def queue_context(run: Run) -> dict[str, Any]:
    """A run's place in its workflow's queue, for the run page's status area."""
    from sessions.services.runstate import concurrency_limit, queue_position

    ahead = queue_position(run)
    return {
        "run": run,
        "ahead": ahead,
        "limit": concurrency_limit(run.workflow) if ahead is not None else None,
    }


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
