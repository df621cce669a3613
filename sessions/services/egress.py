"""A run's egress supervisor seen from the run core: where it keeps its state, starting it, and
recording what it refused (its spool) on the run's timeline and in the audit trail.

The supervisor itself (``sessions.engine.sandbox.egress``) is a detached process that outlives the
worker that started it; these functions are how a worker or the host's housekeeping reads it.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record
from sessions.engine.sandbox.egress import SPOOL_FILE, Egress, read_spool, start
from sessions.engine.sandbox.workdirs import ensure_root
from sessions.models import Run
from sessions.services.records import event_append, lock_run


def egress_root() -> Path:
    """Where egress supervisors keep their state: beside the sandboxes, on their host (and out
    of the browser's sight: a namespaced browser sees none of the sandbox root)."""
    return settings.ENGINE_CONFIG.sandbox_dir.absolute() / "egress"


def egress_dir(run_key: str) -> Path:
    """Where one run's egress supervisor keeps its state."""
    return egress_root() / run_key


def egress_start(*, run_key: str, allowed_hosts: list[str], deadline: float) -> Egress:
    root = egress_dir(run_key).parent.parent
    ensure_root(root)
    return start(egress_dir(run_key), allowed_hosts=allowed_hosts, deadline=deadline)


# The spool --------------------------------------------------------------------------------------


def _record(run: Run, line: dict[str, Any]) -> None:
    payload = {key: line.get(key) for key in ("host", "port", "method", "reason", "quiet")}
    if not payload["quiet"]:
        event_append(run, "egress_denied", payload)
    audit_record(
        action="run.egress_denied",
        object_type="run",
        object_id=run.pk,
        team_id=run.team_id,
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
