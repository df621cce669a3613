"""The run files retention policy: screenshots, observations and downloads of runs that ended
more than ``RUN_FILES_RETENTION_DAYS`` ago are deleted by housekeeping. Rows stay (with their
sha256 hashes, which the evidence bundle carries) and the audit trail is never pruned; every
pruning is itself an audit event."""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record
from sessions.models import Run

# Runs per pass: a first pass over a large backlog does not hold the worker for long.
PRUNE_BATCH = 500


def _files_of(run_id: int) -> Path:
    return Path(settings.RUN_FILES_DIR) / str(run_id)


def _size(root: Path) -> tuple[int, int]:
    files = total = 0
    for path in root.rglob("*"):
        if path.is_file():
            files += 1
            total += path.stat().st_size
    return files, total


def run_files_prune(*, now: datetime | None = None, days: int | None = None) -> list[int]:
    """Delete the files of ended runs older than the retention period; returns the run ids.

    Idempotent: a run is pruned once (``files_pruned_at``); a second pass finds nothing. With a
    retention of 0 days nothing is ever pruned.
    """
    keep_days = settings.RUN_FILES_RETENTION_DAYS if days is None else days
    if keep_days <= 0:
        return []
    cutoff = (now or timezone.now()) - timedelta(days=keep_days)
    due = list(
        Run.objects.filter(
            status__in=Run.FINAL, finished_at__lt=cutoff, files_pruned_at__isnull=True
        )
        .order_by("pk")
        .values_list("pk", flat=True)[:PRUNE_BATCH]
    )
    pruned = []
    for run_id in due:
        if _prune_one(run_id, cutoff, keep_days):
            pruned.append(run_id)
    return pruned


def _prune_one(run_id: int, cutoff: datetime, keep_days: int) -> bool:
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if run.files_pruned_at is not None or not run.is_final or run.finished_at is None:
            return False
        if run.finished_at >= cutoff:
            return False
        root = _files_of(run_id)
        files, size = _size(root) if root.is_dir() else (0, 0)
        run.files_pruned_at = timezone.now()
        run.save(update_fields=["files_pruned_at"])
        audit_record(
            action="run.files_pruned",
            object_type="run",
            object_id=run.pk,
            team_id=run.team_id,
            actor_kind=AuditEvent.ActorKind.SYSTEM,
            after={"files": files, "bytes": size, "retention_days": keep_days},
            run_id=run.pk,
        )
        # Deleted once the row and its audit event are committed: a failed commit leaves the
        # files in place for the next pass, never files gone without a record.
        transaction.on_commit(lambda: shutil.rmtree(root, ignore_errors=True))
    return True


def run_files_usage() -> tuple[int, int]:
    """(files, bytes) under the run files directory, for the system page."""
    root = Path(settings.RUN_FILES_DIR)
    return _size(root) if root.is_dir() else (0, 0)
