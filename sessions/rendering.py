"""HTML fragments of a run page, for the first render and for live updates alike."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from django.contrib.auth.models import User
from django.http import HttpRequest
from django.template.loader import render_to_string

from approvals.models import ApprovalRequest
from approvals.questions import question_refusal
from approvals.selectors import question_pending
from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability
from sessions import selectors
from sessions.engine.last_frame import LAST_FRAME, last_frame_at
from sessions.engine.steps.ask import ask_audience
from sessions.engine.vocabulary import STALE_SESSION
from sessions.models import Run, RunEvent, StepResult
from sessions.services.control import control_unavailable
from sessions.services.launch import reconcile_refusal
from sessions.services.runstate import concurrency_limit, queue_position, run_files_dir


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
    def of(cls, user: Any, *, team_id: int | None = None) -> Viewer:
        """What ``user`` may do on a run of the team ``team_id`` (without it: in any team)."""
        if user is None:
            return cls()
        return cls(
            can_cancel=user_can(user, Capability.LAUNCH_RUNS, team_id=team_id),
            can_reconcile=user_can(user, Capability.DECIDE_APPROVALS, team_id=team_id),
            can_audit=user_can(user, Capability.VIEW_AUDIT, team_id=team_id),
            can_see_approvals=user_can(user, Capability.VIEW_APPROVALS, team_id=team_id),
            user_id=getattr(user, "pk", None),
        )


def header_html(run: Run, viewer: Viewer, request: HttpRequest | None = None) -> str:
    """The run's header. Its forms carry a CSRF token only when ``request`` is given (the first
    render); after a live update they post through htmx, which sends the page's token."""

    pending = run.approvals.filter(status=ApprovalRequest.Status.PENDING).first()
    question = question_pending(run) if run.status == Run.Status.AWAITING_ANSWER else None
    refusal = ""
    if question is not None:
        user = User.objects.filter(pk=viewer.user_id).first() if viewer.user_id else None
        refusal = (question_refusal(user, question) or "") if user else "sign in to answer"
    context = {
        "run": run,
        "can_cancel": viewer.can_cancel,
        # Neither the launcher nor the action's approvers settle it (see reconcile_refusal).
        "can_reconcile": run.status == Run.Status.NEEDS_RECONCILIATION
        and not reconcile_refusal(run, user_id=viewer.user_id, may_decide=viewer.can_reconcile),
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


# The live area's words for a run whose browser sends no frames, by status.
_LIVE_WORDS = {
    Run.Status.QUEUED: "Queued — the browser starts when the run does.",
    Run.Status.STARTING: "Starting — the run's browser is being prepared.",
    Run.Status.RUNNING: "Running — the live picture comes in a moment.",
    Run.Status.AWAITING_APPROVAL: "Waiting for approval — the browser is paused.",
    Run.Status.AWAITING_ANSWER: "Waiting for an answer — the browser is paused.",
    Run.Status.NEEDS_RECONCILIATION: "Stopped — it needs reconciliation; the browser is closed.",
}


@dataclass(frozen=True)
class LiveStill:
    """What the live area shows of a run when no live frame is on screen."""

    words: str
    # The run's file shown ("" for none), a query that changes with it, and its description.
    picture: str
    picture_version: str
    picture_alt: str
    # Whether frames may come: the run's browser is being driven (or about to be).
    live: bool
    take_refusal: str


def live_still(run: Run) -> LiveStill:
    """The run's state in words and the newest picture of its browser: the last live frame when
    a viewer watched until the worker let go of the browser, else the last step's screenshot."""
    words = _LIVE_WORDS.get(
        Run.Status(run.status), f"Finished: {run.get_status_display()} — the browser is closed."
    )
    picture = version = alt = ""
    if run.files_pruned_at is None:
        step = run.step_results.exclude(screenshot="").order_by("-index").first()
        step_done = (
            step.started_at.timestamp() + step.duration_ms / 1000 if step is not None else None
        )
        frame_at = last_frame_at(run_files_dir(run.pk))
        if frame_at is not None and (step_done is None or frame_at >= step_done):
            picture, version = LAST_FRAME, str(int(frame_at * 1000))
            alt = "The run's browser as the live view last showed it"
        elif step is not None:
            picture, version = step.screenshot, str(step.index)
            alt = f"The run's browser after step {step.index + 1}"
    return LiveStill(
        words=words,
        picture=picture,
        picture_version=version,
        picture_alt=alt,
        live=run.status in (Run.Status.STARTING, Run.Status.RUNNING),
        take_refusal=control_unavailable(run),
    )


def live_still_html(run: Run) -> str:
    return render_to_string(
        "sessions/partials/_live.html#live-still", {"run": run, "still": live_still(run)}
    )


def queue_context(run: Run) -> dict[str, Any]:
    """A run's place in its workflow's queue, for the run page's status area."""

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


# Everyone watching a run is told of an event at the same moment, and each viewer's consumer
# renders its update on daphne's one database thread. What is the same for all of them (the
# timeline entry, the side panel, the header for one kind of viewer) is rendered once and kept
# for a moment: long enough for every viewer of that event, too short to show a stale run.
SHARED_RENDER_SECONDS = 2.0
_SHARED_RENDER_LIMIT = 1024
_shared_renders: dict[Hashable, tuple[float, str]] = {}
_shared_renders_lock = threading.Lock()


def _shared(key: Hashable, render: Callable[[], str]) -> str:
    now = time.monotonic()
    with _shared_renders_lock:
        kept = _shared_renders.get(key)
        if kept is not None and now - kept[0] < SHARED_RENDER_SECONDS:
            return kept[1]
    html = render()
    with _shared_renders_lock:
        if len(_shared_renders) >= _SHARED_RENDER_LIMIT:
            for old in [k for k, (at, _) in _shared_renders.items()
                        if now - at >= SHARED_RENDER_SECONDS]:  # fmt: skip
                del _shared_renders[old]
            if len(_shared_renders) >= _SHARED_RENDER_LIMIT:
                _shared_renders.clear()
        _shared_renders[key] = (now, html)
    return html


def _header_kind(run: Run, viewer: Viewer) -> Hashable:
    """What of ``viewer`` the header shows: viewers alike in it share one render."""
    launcher = viewer.user_id is not None and viewer.user_id == run.launched_by_id
    return (
        viewer.can_cancel,
        viewer.can_reconcile and not launcher,
        viewer.can_audit,
        viewer.can_see_approvals or launcher,
        # Whether this person may answer the run's question is theirs alone.
        viewer.user_id if run.status == Run.Status.AWAITING_ANSWER else None,
    )


def _identity(event: RunEvent) -> tuple[int, int, Any]:
    # With its time: a database that rolled back a run may give its id and sequence to another.
    return (event.run_id, event.seq, event.created_at)


def _event_fragments(event: RunEvent) -> list[Fragment]:
    if event.type == "step":
        step_id = event.payload.get("step_result")

        def render_step() -> str:
            step = StepResult.objects.select_related("run").filter(pk=step_id).first()
            return step_html(step) if step is not None else ""

        html = _shared(("step", *_identity(event)), render_step)
        return [{"target": "#timeline", "html": html}] if html else []
    if event.type == "egress_denied":
        html = _shared(("denial", *_identity(event)), lambda: denial_html(event))
        return [{"target": "#denials", "html": html}]
    return []


def messages_for(run_id: int, events: Sequence[RunEvent], viewer: Viewer) -> list[dict[str, Any]]:
    """The run page's updates for ``events``, in order (idempotent by element id).

    The header and side panel show the run as it is now, not as it was at each event, so only
    the last message carries them: a viewer catching up on fifty events gets them once.
    """
    if not events:
        return []
    run = Run.objects.select_related(
        "workflow", "version", "launched_by", "session_template__requested_by"
    ).get(pk=run_id)
    fragments = [_event_fragments(event) for event in events]
    last = _identity(events[-1])
    current: list[Fragment] = [
        {
            "target": "#run-header",
            "html": _shared(
                ("header", *last, _header_kind(run, viewer)),
                lambda: header_html(run, viewer),
            ),
        },
        {"target": "#run-side", "html": _shared(("side", *last), lambda: side_html(run))},
        # Replaces the live area's picture and words where the page has a live area.
        {"target": "#live-still", "html": _shared(("live", *last), lambda: live_still_html(run))},
    ]
    fragments[-1] = current + fragments[-1]
    final = run.status in Run.FINAL
    return [
        {"seq": event.seq, "fragments": its, "final": final}
        for event, its in zip(events, fragments, strict=True)
    ]
