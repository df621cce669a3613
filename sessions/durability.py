"""What keeps a run alive across worker restarts: the host's housekeeping (adopting waiting runs,
failing the ones whose sandbox died, re-sending work whose message was lost).

A run's browser and its egress proxy (``sessions.engine.sandbox.egress``) are detached processes
that outlive the worker that started them. Which worker continues the run does not matter, as
long as it is on the sandbox's host; so the run's liveness while nobody executes it is its
sandbox's, not a worker's: the host's housekeeping checks the supervisor and the browser and
beats for them.
"""

from __future__ import annotations

import logging
import socket
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from approvals.models import ApprovalRequest, Question
from approvals.questions import dispatch_answer_continuation
from approvals.services import approval_void_pending, dispatch_continuation
from pandaweb.core.dispatch import dispatch, task_named
from sessions.models import Run
from sessions.services.egress import run_drain_egress
from sessions.services.launch import run_reap, sandbox_reap_orphans
from sessions.services.records import lock_run
from sessions.services.runstate import destroy_sandbox, queues_release_all, transition
from sessions.services.sandboxes import sandbox_alive

logger = logging.getLogger(__name__)

S = Run.Status


def _waits_for_a_worker(run: Run) -> bool:
    """Waiting for a person, or approved (answered) with its continuation not started yet:
    nobody executes the run, so nobody else beats for it."""
    if run.status in Run.WAITING_FOR_PEOPLE:
        return True
    if run.status != S.RUNNING:
        return False
    return (
        ApprovalRequest.objects.filter(
            run=run, status=ApprovalRequest.Status.APPROVED, continued_at__isnull=True
        ).exists()
        or Question.objects.filter(
            run=run, status=Question.Status.ANSWERED, continued_at__isnull=True
        ).exists()
    )


def run_fail_lost_sandbox(*, run_id: int, why: str) -> bool:
    """End a run nobody executes whose sandbox died: failed, with the reason. True if it ended.

    Re-checked under the run's lock: a continuation that already started owns the run.
    """
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
    report: dict[str, list[Any]] = {"orphans": sandbox_reap_orphans()}
    report.update(runs_adopt_on_host())
    report["reaped"] = run_reap()
    report["requeued"] = runs_redispatch_queued()
    report["released"] = queues_release_all()
    return report
