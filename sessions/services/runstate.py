"""Every state change of a run: one transaction, the run row locked, one audit event, one
RunEvent. The run's state machine lives here and nowhere else; it is the only run API other
apps use."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import secrets
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_chain_lock, audit_record
from pandaweb.core.dispatch import dispatch, task_named
from sessions.engine.sandbox._proc import RECORD_FILE, read_pgid, remove_workdir, stop_browser
from sessions.engine.sandbox.base import Sandbox
from sessions.events import publish_queue_changed
from sessions.models import Run
from sessions.services.egress import drain_locked, egress_finish
from sessions.services.records import (
    event_append,
    recover_completed_actions_locked,
)
from sessions.services.sandboxes import sandbox_backend
from sessions.signals import run_transitioned
from workflows.models import Workflow, WorkflowVersion

logger = logging.getLogger(__name__)

S = Run.Status
TRANSITIONS: dict[str, frozenset[str]] = {
    S.QUEUED: frozenset({S.STARTING, S.CANCELLED, S.FAILED}),
    S.STARTING: frozenset({S.RUNNING, S.FAILED, S.CANCELLED, S.INTERRUPTED, S.EXPIRED}),
    S.RUNNING: frozenset(
        {S.AWAITING_APPROVAL, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.EXPIRED, S.INTERRUPTED}
        | {S.NEEDS_RECONCILIATION, S.AWAITING_ANSWER}
    ),
    S.AWAITING_APPROVAL: frozenset({S.RUNNING, S.CANCELLED, S.EXPIRED, S.FAILED, S.INTERRUPTED}),
    S.AWAITING_ANSWER: frozenset({S.RUNNING, S.CANCELLED, S.FAILED, S.INTERRUPTED}),
    # Only a person leaves this state, saying whether the action happened.
    S.NEEDS_RECONCILIATION: frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED}),
}


class RunError(Exception):
    def __init__(self, message: str, field_errors: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.field_errors = field_errors or {}


class TransitionRefused(RunError):
    pass


class IdempotencyKeyReused(RunError):
    """A launch named a key already used for another workflow or other inputs."""


IDEMPOTENCY_KEY_MAX_LENGTH = 100


# Locks, events, transitions -----------------------------------------------------------------


def transition(
    run: Run,
    to: str,
    *,
    actor: User | None = None,
    reason: str = "",
    audit_extra: Mapping[str, Any] | None = None,
    **fields: Any,
) -> Run:
    """Move a locked run to ``to`` if the state machine allows it, with its event and audit."""
    if to not in TRANSITIONS.get(run.status, frozenset()):
        raise TransitionRefused(f"a {run.get_status_display().lower()} run cannot become {to}")
    before = run.status
    # A queued run that leaves the queue moves the ones behind it, and its page's queue line.
    left_queue = run.status == S.QUEUED
    if "sandbox" in fields and fields["sandbox"] is None:
        # The egress proxy's refusals so far belong before the run's last status in its timeline.
        drain_locked(run)
    if to in (S.INTERRUPTED, S.FAILED):
        # An approved action that completed shows as done even when its step's record was lost.
        recover_completed_actions_locked(run)
    run.status = to
    for name, value in fields.items():
        setattr(run, name, value)
    if to in Run.FINAL:
        run.finished_at = timezone.now()
    settles = to in Run.FINAL or to == S.NEEDS_RECONCILIATION
    if settles and "failure_reason" not in fields and reason and not run.failure_reason:
        run.failure_reason = reason
    event_append(run, "status", {"from": before, "to": to, "reason": reason})
    run.save()
    audit_record(
        action=f"run.{to}",
        object_type="run",
        object_id=run.pk,
        team_id=run.team_id,
        actor=actor,
        actor_kind=None if actor else AuditEvent.ActorKind.RUNNER,
        before={"status": before},
        after={"status": to, **({"reason": reason} if reason else {})},
        run_id=run.pk,
        extra=audit_extra,
    )
    # Inside the transaction: what a subscriber records (a webhook message) commits or rolls
    # back with the move itself.
    run_transitioned.send(sender=Run, run=run, before=before, to=to)
    if settles:
        # The settled run's slot goes to the next one waiting, in this same transaction: a
        # release that could be lost between two transactions would strand the queue.
        queue_release(workflow_id=run.workflow_id)
    if left_queue:
        publish_queue_changed(run.workflow_id)
    return run


# The workflow's queue ---------------------------------------------------------------------------

# What a workflow's concurrency limit counts: runs holding a browser or about to. A run waiting
# for an approval keeps its browser; a run to reconcile has lost it.
OCCUPYING = Q(status__in=Run.ACTIVE) | Q(status=S.QUEUED, dispatched_at__isnull=False)
WAITING = Q(status=S.QUEUED, dispatched_at=None)
QUEUE_ORDER = ("-priority", "created_at", "id")
# The first key of the PostgreSQL advisory lock of one workflow's queue (ASCII "pwqu"; the second
# key is the workflow's id). The two-key form never collides with the audit chain's one key.
QUEUE_LOCK_CLASS = 0x70777175


def _lock_queue(workflow_id: int) -> None:
    """Count and hand out one workflow's slots one transaction at a time, until commit.

    After the audit chain's lock, always: a settle has written its audit row (holding the
    chain) before it releases the queue, so a queue lock taken first anywhere would deadlock
    against it. Not the workflow's row either: publishing holds that while it writes audit rows.
    SQLite needs nothing: its transactions begin holding the database's one write lock.
    """
    audit_chain_lock()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [QUEUE_LOCK_CLASS, workflow_id])


def concurrency_limit(workflow: Workflow) -> int:
    """Runs of the workflow at once: its latest published version's ``max_concurrent_runs``
    (the workflow's own setting while nothing is published)."""
    version = (
        workflow.versions.filter(status=WorkflowVersion.Status.PUBLISHED)
        .order_by("-number")
        .first()
    )
    if version is None:
        return int(workflow.max_concurrent_runs)
    return version.settings_model.max_concurrent_runs


def queue_release(*, workflow_id: int, launching: int | None = None) -> list[int]:
    """Hand a workflow's waiting runs to workers, highest priority first and then oldest, while
    fewer of its runs than its limit hold a browser. Returns the ids of the runs dispatched.

    Joins the caller's transaction. The workflow's queue lock is taken before counting, so the
    launches and settles of one workflow count its slots one at a time: a launch and a settle
    counting at once would each leave the free slot to the other. Waiting runs are locked with
    SKIP LOCKED: one that is being cancelled right now is passed over, never waited for (its
    cancel releases the queue again). Idempotent: with no
    free slot or nobody waiting nothing changes. ``launching``: a run being launched in this
    transaction, whose launch event and audit row already say it went straight to a worker.
    """
    with transaction.atomic():
        _lock_queue(workflow_id)
        workflow = Workflow.objects.get(pk=workflow_id)
        runs = Run.objects.filter(workflow_id=workflow_id)
        limit = concurrency_limit(workflow)
        free = limit - runs.filter(OCCUPYING).count()
        if free <= 0:
            return []
        chosen = list(
            runs.filter(WAITING)
            .select_for_update(skip_locked=True)
            .order_by(*QUEUE_ORDER)
            .values_list("pk", flat=True)[:free]
        )
        now = timezone.now()
        for run in Run.objects.filter(pk__in=chosen).order_by(*QUEUE_ORDER):
            run.dispatched_at = now
            if run.pk == launching:
                run.save(update_fields=["dispatched_at"])
                dispatch(task_named("runs.execute"), run_id=run.pk)
                continue
            waited = round((now - run.created_at).total_seconds(), 3)
            event_append(run, "dispatched", {"waited_seconds": waited})
            run.save(update_fields=["dispatched_at", "last_event_seq"])
            audit_record(
                action="run.dispatched",
                object_type="run",
                object_id=run.pk,
                team_id=run.team_id,
                actor_kind=AuditEvent.ActorKind.RUNNER,
                before={"queued": True},
                after={
                    "priority": run.get_priority_display().lower(),
                    "waited_seconds": waited,
                    "limit": limit,
                },
                run_id=run.pk,
            )
            dispatch(task_named("runs.execute"), run_id=run.pk)
        if set(chosen) - {launching}:
            publish_queue_changed(workflow_id)
        return chosen


def queues_release_all() -> list[int]:
    """Housekeeping's safety net: fill the free slots of every workflow with waiting runs (its
    limit was raised by a new version, say). Returns the runs dispatched."""
    released: list[int] = []
    waiting = Run.objects.filter(WAITING).order_by().values_list("workflow_id", flat=True)
    for workflow_id in waiting.distinct():
        released += queue_release(workflow_id=workflow_id)
    return released


def queue_position(run: Run) -> int | None:
    """How many runs of its workflow a waiting run has ahead of it (None: it is not waiting)."""
    if not run.waits_for_slot:
        return None
    ahead = Q(priority__gt=run.priority) | Q(priority=run.priority, created_at__lt=run.created_at)
    ahead |= Q(priority=run.priority, created_at=run.created_at, id__lt=run.pk)
    return Run.objects.filter(workflow_id=run.workflow_id).filter(WAITING).filter(ahead).count()


def destroy_sandbox(data: dict[str, Any]) -> None:
    """Stop a run's browser and its egress supervisor, wherever on its host they run.

    ``data`` is the run's sandbox record: a full ``Sandbox.to_dict()``, or only what is known
    while the sandbox starts (``pending``), in which case its workdir is found by run key.
    Idempotent.
    """
    host = str(data.get("host") or socket.gethostname())
    if host != socket.gethostname():
        task_named("runs.destroy_sandbox").apply_async(
            kwargs={"sandbox": data}, queue=host_queue(host)
        )
        return
    try:
        if data.get("pending"):
            _destroy_pending(data)
        else:
            sandbox = Sandbox.from_dict(data)
            sandbox_backend(sandbox.backend).destroy(sandbox)
    except Exception:  # a sandbox that is already gone must not stop a cancel
        logger.exception("destroying sandbox %s failed", data.get("run_key"))
    try:
        egress_finish(data)
    except Exception:
        logger.exception("stopping the egress proxy of %s failed", data.get("run_key"))


def _destroy_pending(data: dict[str, Any]) -> None:
    """A sandbox recorded before its backend returned (its starter died): found by run key."""
    backend = sandbox_backend(str(data.get("backend", "")))
    root = getattr(backend, "root", None)
    key = str(data.get("run_key", ""))
    if root is None or not key or "/" in key or key.startswith("."):
        return  # a remote sandbox dies of its own idle time-out
    workdir = Path(root) / key
    with contextlib.suppress(OSError, ValueError):
        backend.destroy(Sandbox.from_dict(json.loads((workdir / RECORD_FILE).read_text())))
        return
    with contextlib.suppress(FileNotFoundError):
        (workdir / "deadline").unlink()
    stop_browser(str(workdir), *(read_pgid(workdir) or (None, None)))
    remove_workdir(workdir)


def host_queue(host: str) -> str:
    """The Celery queue that reaches the workers of one machine (sandboxes live on one host)."""
    return f"host.{host}"


def installation_tag() -> str:
    """Eight hex characters naming this installation (its database and secret key), put in its
    sandboxes' run keys: housekeeping on a host that several installations (or test processes)
    share takes only its own leftovers for orphans."""
    database = connection.settings_dict
    seed = "|".join(
        str(part)
        for part in (
            settings.SECRET_KEY,
            database.get("HOST", ""),
            database.get("PORT", ""),
            database.get("NAME", ""),
        )
    )
    return hashlib.sha256(seed.encode()).hexdigest()[:8]


def sandbox_run_key(run_id: int) -> str:
    """A fresh run key for one start of a run's sandbox: ``run-<id>-<installation><random>``."""
    return f"run-{run_id}-{installation_tag()}{secrets.token_hex(4)}"


def run_files_dir(run_id: int) -> Path:
    return Path(settings.RUN_FILES_DIR) / str(run_id)
