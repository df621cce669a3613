"""The worker-side record writer: steps, denials, irreversible actions and the heartbeat of a
run, written as the runner reports them."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import (
    DatabaseError,
    close_old_connections,
    connection,
    connections,
    transaction,
)
from django.utils import timezone

from approvals.models import ApprovalRequest
from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record
from sessions.engine import recording
from sessions.models import Artifact, Run, StepResult
from sessions.services.egress import run_drain_egress
from sessions.services.records import event_append, lock_run
from sessions.services.runstate import S, TransitionRefused, run_files_dir

logger = logging.getLogger(__name__)


class RunSink:
    """Where the runner reports. Records are persisted by a writer thread of their own: the
    runner's thread runs Playwright's event loop, where Django refuses database calls, and
    persistence off the runner's path keeps recording cheap."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self._queue: queue.Queue[tuple[str, Any] | None] = queue.Queue()
        self._stop_reason: str | None = None
        self.approval_id: int | None = None
        self._writer = threading.Thread(
            target=self._write, name=f"run-{run_id}-writer", daemon=True
        )
        self._writer.start()

    def step_finished(self, record: Any) -> None:
        self._queue.put(("step", record))

    def denied(self, attempt: Any) -> None:
        # Called on the proxy's thread.
        self._queue.put(("denial", attempt))

    def stop_reason(self) -> str | None:
        return self._stop_reason

    def action_starting(self, index: int) -> None:
        self._write_now("intent")

    def action_finished(self, index: int, result: str = "") -> None:
        self._write_now("completion", result)

    def action_refused(self, index: int, reason: str) -> None:
        self._write_now("refused", reason)

    def _write_now(self, phase: str, result: str = "") -> None:
        """Persist on the writer thread, after everything queued before, and wait for it."""
        if self.approval_id is None:
            raise RuntimeError("no approval is attached to this run's continuation")
        done: queue.Queue[BaseException | None] = queue.Queue()
        self._queue.put(("action", (phase, result, done)))
        error = done.get()
        if error is not None:
            raise error

    def request_stop(self, reason: str) -> None:
        self._stop_reason = reason

    def close(self) -> None:
        """Wait until everything reported so far is in the database."""
        self._queue.put(None)
        self._writer.join()

    def _record_action(
        self, phase: str, result: str, done: queue.Queue[BaseException | None]
    ) -> None:
        told = threading.Event()

        def committed() -> None:
            told.set()
            done.put(None)

        try:
            assert self.approval_id is not None
            run_record_action(
                run_id=self.run_id,
                approval_id=self.approval_id,
                phase=phase,
                result=result,
                committed=committed,
            )
        except BaseException as exc:
            if not told.is_set():
                done.put(exc)
            else:
                # The record is committed and the runner went on; only telling the run's
                # viewers failed, and they re-read the events when they reconnect.
                logger.exception("publishing the %s of run %s failed", phase, self.run_id)
        else:
            if not told.is_set():  # inside an outer transaction: committed with it
                done.put(None)

    def _write(self) -> None:
        try:
            # Connect while the runner connects to the browser: an approved action's intent is
            # written while the reviewer waits for the action. A database that does not answer
            # now is met again, and reported, by the first write.
            with contextlib.suppress(DatabaseError):
                connection.ensure_connection()
            while (item := self._queue.get()) is not None:
                # A run outlives many connections: like a request, each record starts with one
                # that works (a connection the server closed is replaced, not failed on).
                close_old_connections()
                kind, payload = item
                if kind == "action":
                    self._record_action(*payload)
                    continue
                try:
                    if kind == "step":
                        run_record_step(run_id=self.run_id, record=payload)
                    else:
                        run_record_denial(run_id=self.run_id, attempt=payload)
                except Exception:
                    logger.exception("recording %s of run %s failed", kind, self.run_id)
        finally:
            for conn in connections.all(initialized_only=True):
                conn.close()


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def run_record_action(
    *,
    run_id: int,
    approval_id: int,
    phase: str,
    result: str = "",
    committed: Callable[[], None] | None = None,
) -> None:
    """The intent to perform an approved action (``phase="intent"``), its completion
    (``"completion"``, ``result`` saying how the portal showed it) or the portal's refusal of it
    (``"refused"``, ``result`` in the portal's words: the action was not done).

    Committed before the runner goes on: an intent without a completion or a refusal is what
    tells a crash in the middle of a payment from one before it. ``committed`` is called right
    after the commit, before the run's viewers are told.
    """
    with transaction.atomic():
        if committed is not None:
            # Registered before the event's own callback: on-commit work runs in order.
            transaction.on_commit(committed)
        run = lock_run(run_id)
        approval = ApprovalRequest.objects.select_for_update().get(pk=approval_id, run=run)
        if run.status != S.RUNNING or run.cancel_requested:
            raise TransitionRefused(f"the run is {run.get_status_display().lower()}; not acting")
        now = timezone.now()
        if phase == "intent":
            if approval.intent_at is not None:
                raise TransitionRefused("this approved action was already started once")
            approval.intent_at = now
        elif phase == "refused":
            approval.refused_at = now
        else:
            approval.completed_at = now
        approval.action_result = result[:2000]
        approval.save(update_fields=["intent_at", "completed_at", "refused_at", "action_result"])
        event_append(
            run,
            f"action_{phase}",
            {"approval": approval.pk, "step": approval.step_id, "result": result[:2000]},
        )
        run.save(update_fields=["last_event_seq"])
        verb = {"intent": "started", "refused": "refused"}.get(phase, "completed")
        audit_record(
            action=f"approval.action_{verb}",
            object_type="approval",
            object_id=approval.pk,
            team_id=run.team_id,
            actor_kind=AuditEvent.ActorKind.RUNNER,
            after={
                "step": approval.step_id,
                "evidence_sha256": approval.evidence_sha256,
                **({"result": result[:2000]} if result else {}),
            },
            run_id=run.pk,
            approval_id=approval.pk,
        )


class Heartbeat:
    """Tells the reaper this worker is alive while a run executes here, and tells the runner
    when the run was cancelled (checked every second, so a cancel stops it quickly)."""

    def __init__(
        self,
        run_id: int,
        sink: RunSink,
        interval: float = 1.0,
        beat_every: int | None = None,
        spool: Path | None = None,
    ) -> None:
        self.run_id = run_id
        self.sink = sink
        # The run's egress supervisor spools refusals; they are recorded as they come.
        self.spool = spool / "denials.jsonl" if spool is not None else None
        self._spooled = 0
        self.interval = interval
        # Several beats per reaper timeout, so one slow tick is never taken for a dead worker.
        timeout = settings.RUN_HEARTBEAT_TIMEOUT_SECONDS
        self.beat_every = beat_every or max(1, min(5, timeout // 4))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{run_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    def _drain(self) -> None:

        if self.spool is None:
            return
        try:
            size = self.spool.stat().st_size
        except FileNotFoundError:
            return
        if size != self._spooled:
            self._spooled = size
            run_drain_egress(run_id=self.run_id)

    def _tick(self, ticks: int) -> None:
        if ticks % self.beat_every == 0:
            Run.objects.filter(pk=self.run_id, status__in=Run.ACTIVE).update(
                heartbeat_at=timezone.now()
            )
        state = Run.objects.filter(pk=self.run_id).values("status", "cancel_requested")
        row = state.first()
        if row is None or row["cancel_requested"] or row["status"] in Run.FINAL:
            self.sink.request_stop("the run was cancelled")
        self._drain()

    def _loop(self) -> None:
        ticks = 0
        try:
            while not self._stop.wait(self.interval):
                ticks += 1
                # One failed tick must not end the heartbeat: the reaper would take the run for
                # dead. Each tick starts with a working connection, as a request would.
                close_old_connections()
                try:
                    self._tick(ticks)
                except DatabaseError:
                    logger.warning("heartbeat of run %s missed a tick", self.run_id, exc_info=True)
        finally:
            for conn in connections.all(initialized_only=True):
                conn.close()


def run_record_step(*, run_id: int, record: Any) -> StepResult:
    """Persist one executed step: files (the overlay and thumbnail are drawn here, on the
    writer thread), the step row, artifacts, an event, an audit event."""
    directory = run_files_dir(run_id) / "steps"
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"{record.index + 1:03d}-{record.step_id}"
    files: dict[str, str] = {}
    # The observation is built here too: the runner only took the snapshot.
    pictures = recording.finish(record)
    overlay_jpeg, thumbnail_jpeg = pictures.overlay, pictures.thumbnail
    for key, content, suffix in (
        ("screenshot", record.screenshot, ".jpg"),
        ("overlay", overlay_jpeg, ".overlay.jpg"),
        ("thumbnail", thumbnail_jpeg, ".thumb.jpg"),
    ):
        if content:
            path = directory / f"{stem}{suffix}"
            path.write_bytes(content)
            files[key] = str(path.relative_to(run_files_dir(run_id)))
    observation_json = json.dumps(record.observation, sort_keys=True) if record.observation else ""
    with transaction.atomic():
        run = lock_run(run_id)
        result = StepResult.objects.create(
            run=run,
            index=record.index,
            step_id=record.step_id,
            step_type=record.step_type,
            sentence=record.sentence,
            status=record.status,
            started_at=record.started_at,
            duration_ms=record.duration_ms,
            url=record.url,
            title=record.title,
            error=record.error,
            observation=record.observation,
            observation_chars=record.observation_chars,
            observation_tokens=record.observation_tokens,
            observation_sha256=_sha256(observation_json.encode()) if observation_json else "",
            screenshot=files.get("screenshot", ""),
            screenshot_sha256=_sha256(record.screenshot) if record.screenshot else "",
            overlay=files.get("overlay", ""),
            thumbnail=files.get("thumbnail", ""),
        )
        for artifact in record.artifacts:
            Artifact.objects.create(
                run=run,
                step_index=record.index,
                name=artifact.name,
                filename=artifact.filename,
                path=str(Path(artifact.path).relative_to(run_files_dir(run_id))),
                sha256=artifact.sha256,
                size=artifact.size,
            )
        run.steps_executed += 1
        run.outputs = {**run.outputs, **record.outputs}
        run.heartbeat_at = timezone.now()
        event_append(
            run, "step", {"index": record.index, "status": record.status, "step_result": result.pk}
        )
        run.save()
        audit_record(
            action="run.step_executed",
            object_type="run",
            object_id=run.pk,
            team_id=run.team_id,
            actor_kind=AuditEvent.ActorKind.RUNNER,
            after={
                "step": record.step_id,
                "index": record.index,
                "status": record.status,
                "screenshot_sha256": result.screenshot_sha256,
                "observation_sha256": result.observation_sha256,
                "artifacts": {a.filename: a.sha256 for a in record.artifacts},
            },
            run_id=run.pk,
            step_id=result.pk,
        )
    return result


def run_record_denial(*, run_id: int, attempt: Any) -> None:
    """An egress attempt the proxy refused: shown on the run page, kept in the audit trail."""
    with transaction.atomic():
        run = lock_run(run_id)
        payload = {
            "host": attempt.host,
            "port": attempt.port,
            "method": attempt.method,
            "reason": attempt.reason,
            "quiet": attempt.quiet,
        }
        if not attempt.quiet:
            event_append(run, "egress_denied", payload)
            run.save(update_fields=["last_event_seq"])
        audit_record(
            action="run.egress_denied",
            object_type="run",
            object_id=run.pk,
            team_id=run.team_id,
            actor_kind=AuditEvent.ActorKind.RUNNER,
            after=payload,
            run_id=run.pk,
        )


def _sha256(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()
