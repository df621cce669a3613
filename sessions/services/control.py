"""Take control: a person drives a running run's browser between two steps.

Opening and closing a control session, and withdrawing a request for one before it opens, are
state changes of the run: each is one transaction with the run's row locked, a RunEvent for the
run page and an audit event. The database holds the one-controller rule (a unique open session
per run), whichever process asks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from pandaweb.audit.services import audit_record
from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability
from sessions.models import ControlSession, Run
from sessions.services.records import event_append, lock_run
from sessions.services.runstate import RunError, S

# The audit event keeps this many inputs in clear; the session row and its file keep them all.
AUDITED_INPUTS = 500

# Why a run whose browser is not working cannot be taken over, by its status.
_NOT_WORKING = {
    S.QUEUED: "this run is queued",
    S.STARTING: "this run's browser is starting",
    S.AWAITING_APPROVAL: "this run is waiting for approval",
    S.AWAITING_ANSWER: "this run is waiting for an answer",
    S.NEEDS_RECONCILIATION: "this run has stopped and needs reconciliation",
}


def control_unavailable(run: Run) -> str:
    """Why nobody can take control of ``run`` as it is now, in words; "" while its browser is
    working (the runner pauses for a person only between the steps it runs)."""
    if run.status == S.RUNNING:
        return ""
    why = _NOT_WORKING.get(S(run.status), "this run has finished")
    return f"Take control is possible while the run's browser is working; {why}."


def control_open(*, run_id: int, user_id: int, step_index: int) -> ControlSession:
    """Give ``user_id`` control of run ``run_id``'s browser, paused before ``step_index``.

    Preconditions: the run is running and nobody else has control; the user holds the control
    capability in the run's team. Raises RunError in the user's words otherwise. Not idempotent.
    """
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if user is None or not user_can(user, Capability.CONTROL_RUNS):
        raise RunError("you may watch this run but not take control of it")
    with transaction.atomic():
        run = lock_run(run_id)
        if not user_can(user, Capability.CONTROL_RUNS, team_id=run.team_id):
            raise RunError("you may not take control of another team's runs")
        if unavailable := control_unavailable(run):
            raise RunError(unavailable)
        holder = run.control_sessions.filter(closed_at__isnull=True).select_related("user").first()
        if holder is not None:
            raise RunError(f"{holder.user.get_username()} has control of this run")
        try:
            with transaction.atomic():
                session = ControlSession.objects.create(run=run, user=user, step_index=step_index)
        except IntegrityError:
            raise RunError("someone else took control of this run a moment ago") from None
        session.files_dir = f"control/{session.pk}"
        session.save(update_fields=["files_dir"])
        event_append(
            run,
            "control_opened",
            {"session": session.pk, "by": user.get_username(), "before_step": step_index},
        )
        run.save(update_fields=["last_event_seq"])
        audit_record(
            action="run.control_opened",
            object_type="run",
            object_id=run.pk,
            team_id=run.team_id,
            actor=user,
            after={"control_session": session.pk, "before_step": step_index + 1},
            run_id=run.pk,
        )
    return session


def control_request_withdraw(*, run_id: int, user_id: int, during_step: int | None) -> None:
    """Record that ``user_id`` withdrew their request for control of run ``run_id`` before it
    was granted, while step ``during_step`` ran (None before the first).

    The request itself lives in the worker's live feed until control opens; only its withdrawal
    is a person changing their mind about the run, so it is what the trail records.
    Precondition: the run exists. Not idempotent: the feed calls it once per request it drops.
    """
    user = get_user_model().objects.filter(pk=user_id).first()
    with transaction.atomic():
        run = lock_run(run_id)
        by = user.get_username() if user is not None else f"user #{user_id}"
        event_append(run, "control_request_withdrawn", {"by": by, "during_step": during_step})
        run.save(update_fields=["last_event_seq"])
        audit_record(
            action="run.control_request_withdrawn",
            object_type="run",
            object_id=run.pk,
            team_id=run.team_id,
            actor=user,
            before={"control_requested_by": by},
            after={"during_step": None if during_step is None else during_step + 1},
            run_id=run.pk,
        )


def control_close(
    *,
    session_id: int,
    reason: str,
    inputs: Sequence[dict[str, Any]],
    navigated: bool,
    typed: bool,
    urls: Sequence[str],
    frames: int,
) -> ControlSession:
    """Close a control session with what happened in it; the runner goes on afterwards.

    Idempotent: closing a closed session changes nothing and records nothing.
    """
    with transaction.atomic():
        run_id = ControlSession.objects.values_list("run_id", flat=True).get(pk=session_id)
        run = lock_run(run_id)
        session = (
            ControlSession.objects.select_for_update().select_related("user").get(pk=session_id)
        )
        if session.closed_at is not None:
            return session
        session.closed_at = timezone.now()
        session.close_reason = reason[:200]
        session.inputs = list(inputs)
        session.navigated = navigated
        session.typed = typed
        session.urls = list(urls)
        session.frames = frames
        session.save()
        summary = {
            "session": session.pk,
            "by": session.user.get_username(),
            "reason": session.close_reason,
            "inputs": len(session.inputs),
            "navigated": navigated,
            "typed": typed,
        }
        event_append(run, "control_closed", summary)
        run.save(update_fields=["last_event_seq"])
        audit_record(
            action="run.control_closed",
            object_type="run",
            object_id=run.pk,
            team_id=run.team_id,
            actor=session.user,
            before={"control_session": session.pk},
            after={
                **summary,
                "urls": list(urls),
                "frames": frames,
                "input_events": list(inputs)[:AUDITED_INPUTS],
            },
            run_id=run.pk,
        )
    return session


def control_close_open_sessions(*, run_id: int, reason: str) -> None:
    """Close whatever control session a run still has open (its worker stopped holding the
    browser). Idempotent."""
    for session_id in ControlSession.objects.filter(
        run_id=run_id, closed_at__isnull=True
    ).values_list("pk", flat=True):
        control_close(
            session_id=session_id, reason=reason, inputs=[], navigated=False, typed=False,
            urls=[], frames=0,
        )  # fmt: skip
