"""What keeps a run alive across worker restarts: its egress supervisor, the refusal spool and
the host's housekeeping (adopting waiting runs, re-sending work whose message was lost).

A run's browser and its egress proxy (``sessions.sandbox.egress``) are detached processes that
outlive the worker that started them. Which worker continues the run does not matter, as long as
it is on the sandbox's host; so the run's liveness while nobody executes it is its sandbox's, not
a worker's: the host's housekeeping checks the supervisor and the browser and beats for them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record
from sessions.models import Run
from sessions.sandbox.egress import SPOOL_FILE, Egress, read_spool

logger = logging.getLogger(__name__)

S = Run.Status


def egress_root() -> Path:
    """Where egress supervisors keep their state: beside the sandboxes, on their host (and out
    of the browser's sight: a namespaced browser sees none of the sandbox root)."""
    from sessions.sandbox import default_root

    return default_root().absolute() / "egress"


def egress_dir(run_key: str) -> Path:
    """Where one run's egress supervisor keeps its state."""
    return egress_root() / run_key


def egress_start(*, run_key: str, allowed_hosts: list[str], deadline: float) -> Egress:
    from sessions.sandbox.egress import start
    from sessions.sandbox.workdirs import ensure_root

    root = egress_dir(run_key).parent.parent
    ensure_root(root)
    return start(egress_dir(run_key), allowed_hosts=allowed_hosts, deadline=deadline)


# The spool --------------------------------------------------------------------------------------


def _record(run: Run, line: dict[str, Any]) -> None:
    from sessions.services.runstate import _event

    payload = {key: line.get(key) for key in ("host", "port", "method", "reason", "quiet")}
    if not payload["quiet"]:
        _event(run, "egress_denied", payload)
    audit_record(
        action="run.egress_denied",
        object_type="run",
        object_id=run.pk,
        actor_kind=AuditEvent.ActorKind.RUNNER,
        # The spool's line number: what tells a tail drained after the run ended from lines
        # already recorded.
        after={**payload, "spooled": int(line["n"])},
        run_id=run.pk,
    )


def drain_locked(run: Run) -> int:
    """Record the refusals spooled since the last drain (``run`` locked; the caller saves it).

    The number of the last line recorded goes into the run's sandbox record in the same
    transaction as the events, so two drains never record a line twice.
    """
    record = run.sandbox or {}
    directory = record.get("egress_dir")
    if not directory or record.get("host") != socket.gethostname():
        return 0
    lines = read_spool(Path(directory), after=int(record.get("egress_seen", 0)))
    for line in lines:
        _record(run, line)
    if lines:
        run.sandbox = {**record, "egress_seen": int(lines[-1]["n"])}
    return len(lines)


def run_drain_egress(*, run_id: int) -> int:
    """Record what a run's egress proxy refused since the last drain. Idempotent."""
    from sessions.services.runstate import lock_run

    with transaction.atomic():
        run = lock_run(run_id)
        drained = drain_locked(run)
        if drained:
            run.save(update_fields=["last_event_seq", "sandbox"])
    return drained


def egress_finish(record: dict[str, Any]) -> None:
    """Stop an ended run's supervisor, record the refusals it spooled after the run's last drain,
    and remove its directory. Idempotent: the spool is claimed by renaming it, so of two
    concurrent callers only one records the tail."""
    directory = record.get("egress_dir")
    if not directory:
        return
    path = Path(directory)
    egress = Egress(path)
    egress.stop()
    claimed = f".{SPOOL_FILE}.{os.getpid()}.{threading.get_ident()}"
    try:
        os.rename(path / SPOOL_FILE, path / claimed)
    except FileNotFoundError:
        claimed = ""
    run_id = record.get("run_id")
    if claimed and run_id:
        _record_tail(int(run_id), path, claimed)
    egress.remove()


def _record_tail(run_id: int, path: Path, name: str) -> None:
    from sessions.services.runstate import lock_run

    try:
        with transaction.atomic():
            run = lock_run(run_id)
            # The run's record (with its drained offset) is gone once it ended; the audit trail
            # says which lines were recorded.
            numbers = AuditEvent.objects.filter(
                run_id=run_id, action="run.egress_denied"
            ).values_list("after__spooled", flat=True)
            seen = max((int(n) for n in numbers if n is not None), default=0)
            lines = read_spool(path, after=seen, name=name)
            for line in lines:
                _record(run, line)
            if lines:
                run.save(update_fields=["last_event_seq"])
    except Run.DoesNotExist:
        return


# What an interrupted run did ------------------------------------------------------------------


def recover_completed_actions_locked(run: Run) -> int:
    """Put on the run's timeline the approved actions whose completion was written but whose
    step record was not (the worker died in between): the portal has the payment, so the page
    must show it too. ``run`` is locked; the caller saves it. Returns how many were recovered.
    """
    from approvals.models import ApprovalRequest
    from sessions.models import StepResult
    from sessions.services.runstate import _event

    recovered = 0
    done = ApprovalRequest.objects.filter(
        run=run, intent_at__isnull=False, completed_at__isnull=False
    ).order_by("step_index")
    steps = (run.version.document or {}).get("steps", [])
    for approval in done:
        if StepResult.objects.filter(run=run, index=approval.step_index).exists():
            continue
        assert approval.intent_at is not None
        assert approval.completed_at is not None
        step = steps[approval.step_index] if approval.step_index < len(steps) else {}
        evidence = approval.evidence or {}
        result = StepResult.objects.create(
            run=run,
            index=approval.step_index,
            step_id=approval.step_id,
            step_type=str(step.get("type", "")),
            sentence=approval.action,
            status=StepResult.Status.SUCCEEDED,
            started_at=approval.intent_at,
            duration_ms=max(
                0, int((approval.completed_at - approval.intent_at).total_seconds() * 1000)
            ),
            url=str(evidence.get("url", "")),
            title=str(evidence.get("title", "")),
        )
        run.steps_executed += 1
        _event(
            run,
            "step",
            {"index": approval.step_index, "status": result.status, "step_result": result.pk},
        )
        audit_record(
            action="run.step_recovered",
            object_type="run",
            object_id=run.pk,
            actor_kind=AuditEvent.ActorKind.RUNNER,
            after={
                "step": approval.step_id,
                "index": approval.step_index,
                "status": result.status,
                "completed_at": approval.completed_at.isoformat(),
                "from": "the approved action's completion record",
            },
            run_id=run.pk,
            step_id=result.pk,
            approval_id=approval.pk,
        )
        recovered += 1
    return recovered


# Housekeeping of a host ---------------------------------------------------------------------------


def _waits_for_a_worker(run: Run) -> bool:
    """Waiting for a person, or approved (answered) with its continuation not started yet:
    nobody executes the run, so nobody else beats for it."""
    if run.status in Run.WAITING_FOR_PEOPLE:
        return True
    if run.status != S.RUNNING:
        return False
    from approvals.models import ApprovalRequest, Question

    return (
        ApprovalRequest.objects.filter(
            run=run, status=ApprovalRequest.Status.APPROVED, continued_at__isnull=True
        ).exists()
        or Question.objects.filter(
            run=run, status=Question.Status.ANSWERED, continued_at__isnull=True
        ).exists()
    )


def sandbox_alive(record: dict[str, Any], *, quick: bool = False) -> str:
    """Why a recorded sandbox can no longer serve its run ('' when it can).

    ``quick`` (on a continuation's path, where every millisecond is the reviewer's wait): the
    supervisor's pid and a signal-0 to the browser's process group, no scan of the host's
    processes; a browser that died anyway fails the run when the runner cannot reconnect.
    """
    from sessions.sandbox import Sandbox, SandboxError, get_backend

    if record.get("egress_dir") and not Egress(record["egress_dir"]).alive():
        return "its egress proxy stopped"
    if quick:
        pgid = record.get("pgid")
        if record.get("host") == socket.gethostname() and isinstance(pgid, int) and pgid > 0:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return "its browser stopped"
            except PermissionError:
                return "its browser's process group belongs to someone else"
        return ""
    try:
        sandbox = Sandbox.from_dict(record)
        if not get_backend(sandbox.backend).alive(sandbox):
            return "its browser stopped"
    except SandboxError as exc:
        return str(exc)
    except Exception as exc:  # a remote backend that cannot be asked counts as gone
        return f"its browser cannot be reached ({exc})"
    return ""


def run_fail_lost_sandbox(*, run_id: int, why: str) -> bool:
    """End a run nobody executes whose sandbox died: failed, with the reason. True if it ended.

    Re-checked under the run's lock: a continuation that already started owns the run.
    """
    from approvals.services import approval_void_pending
    from sessions.services.runstate import destroy_sandbox, lock_run, transition

    with transaction.atomic():
        run = lock_run(run_id)
        if not _waits_for_a_worker(run):
            return False
        reason = f"the run's browser sandbox was lost while it waited ({why}); it cannot continue"
        approval_void_pending(run=run, reason=reason)
        record = run.sandbox
        transition(run, S.FAILED, reason=reason, sandbox=None)
    if record:
        destroy_sandbox(record)
    return True


def runs_adopt_on_host() -> dict[str, list[int]]:
    """Take care of this host's runs that no worker executes (called when a worker starts and
    every housekeeping period): record their spooled refusals, beat for the ones whose sandbox
    lives, fail the ones whose sandbox died, and send again continuations whose message was lost
    (a worker killed after taking it). Idempotent."""
    here = socket.gethostname()
    now = timezone.now()
    patience = timedelta(seconds=settings.RUN_REDISPATCH_AFTER_SECONDS)
    done: dict[str, list[int]] = {"alive": [], "failed": [], "continued": []}
    candidates = Run.objects.filter(
        status__in=[*Run.WAITING_FOR_PEOPLE, S.RUNNING], sandbox__host=here
    ).values_list("pk", flat=True)
    for run_id in list(candidates):
        run = Run.objects.get(pk=run_id)
        if not _waits_for_a_worker(run) or not run.sandbox:
            continue
        why = sandbox_alive(run.sandbox)
        if why:
            if run_fail_lost_sandbox(run_id=run_id, why=why):
                done["failed"].append(run_id)
            continue
        run_drain_egress(run_id=run_id)
        done["alive"].append(run_id)
        if run.status == S.RUNNING:
            Run.objects.filter(pk=run_id, status=S.RUNNING).update(heartbeat_at=now)
            if _continuation_lost(run_id, now - patience):
                done["continued"].append(run_id)
    return done


def _continuation_lost(run_id: int, before: Any) -> bool:
    from approvals.models import ApprovalRequest, Question
    from approvals.questions import dispatch_answer_continuation
    from approvals.services import dispatch_continuation

    question = (
        Question.objects.filter(
            run_id=run_id,
            status=Question.Status.ANSWERED,
            continued_at__isnull=True,
            answered_at__lt=before,
        )
        .order_by("-pk")
        .first()
    )
    if question is not None:
        # As for approvals: the first continuation marks the question continued.
        dispatch_answer_continuation(run_id, question.pk)
        return True

    approval = (
        ApprovalRequest.objects.filter(
            run_id=run_id,
            status=ApprovalRequest.Status.APPROVED,
            continued_at__isnull=True,
            decided_at__lt=before,
        )
        .order_by("-pk")
        .first()
    )
    if approval is None:
        return False
    # A duplicate is harmless: the first continuation marks the approval continued under the
    # run's lock and any other one returns without doing anything.
    dispatch_continuation(run_id, approval.pk)
    return True


def runs_redispatch_queued() -> list[int]:
    """Send again the runs that stayed queued past the patience (their message was lost with a
    killed worker that had prefetched it). The database is the queue of record: executing is
    idempotent through the run's lock, so a message sent twice starts the run once."""
    from pandaweb.core.dispatch import dispatch, task_named

    cutoff = timezone.now() - timedelta(seconds=settings.RUN_REDISPATCH_AFTER_SECONDS)
    sent = []
    # A run still waiting in its workflow's queue was never sent: the queue sends it.
    stale = Run.objects.filter(status=S.QUEUED, dispatched_at__lt=cutoff).exclude(
        heartbeat_at__gte=cutoff
    )
    for run_id in list(stale.values_list("pk", flat=True)):
        # For a queued run heartbeat_at is when it was last sent; the conditional update makes
        # one host's housekeeping send it, not every host's.
        claimed = (
            Run.objects.filter(pk=run_id, status=S.QUEUED)
            .exclude(heartbeat_at__gte=cutoff)
            .update(heartbeat_at=timezone.now())
        )
        if claimed == 1:
            dispatch(task_named("runs.execute"), run_id=run_id)
            sent.append(run_id)
    return sent


def host_housekeeping() -> dict[str, list[Any]]:
    """One period of a host's housekeeping, run by every worker of the host."""
    from sessions.services.launch import run_reap, sandbox_reap_orphans
    from sessions.services.runstate import queues_release_all

    report: dict[str, list[Any]] = {"orphans": sandbox_reap_orphans()}
    report.update(runs_adopt_on_host())
    report["reaped"] = run_reap()
    report["requeued"] = runs_redispatch_queued()
    report["released"] = queues_release_all()
    return report
