"""Every state change of a run: one transaction, the run row locked, one audit event, one
RunEvent. The run's state machine lives here and nowhere else."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import secrets
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, connections, transaction
from django.db.models import Q
from django.utils import timezone

from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record
from pandaweb.core.dispatch import dispatch
from sessions.events import publish_run_events
from sessions.models import Artifact, Run, RunEvent, SessionTemplate, StepResult
from workflows.models import Credential, Workflow, WorkflowVersion
from workflows.schema import Parameter, credentials_used
from workflows.services import vault
from workflows.vault import VaultError

logger = logging.getLogger(__name__)

S = Run.Status
TRANSITIONS: dict[str, frozenset[str]] = {
    S.QUEUED: frozenset({S.STARTING, S.CANCELLED, S.FAILED}),
    S.STARTING: frozenset({S.RUNNING, S.FAILED, S.CANCELLED, S.INTERRUPTED, S.EXPIRED}),
    S.RUNNING: frozenset(
        {S.AWAITING_APPROVAL, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.EXPIRED, S.INTERRUPTED}
        | {S.NEEDS_RECONCILIATION}
    ),
    S.AWAITING_APPROVAL: frozenset({S.RUNNING, S.CANCELLED, S.EXPIRED, S.FAILED, S.INTERRUPTED}),
    # Only a person leaves this state, saying whether the action happened.
    S.NEEDS_RECONCILIATION: frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED}),
}


class RunError(Exception):
    def __init__(self, message: str, field_errors: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.field_errors = field_errors or {}


class TransitionRefused(RunError):
    pass


# Locks, events, transitions -----------------------------------------------------------------


def lock_run(run_id: int) -> Run:
    return Run.objects.select_for_update().get(pk=run_id)


def _event(run: Run, type: str, payload: Mapping[str, Any]) -> RunEvent:
    """Append an event to a locked run (the caller saves ``run``)."""
    run.last_event_seq += 1
    event = RunEvent.objects.create(
        run=run, seq=run.last_event_seq, type=type, payload=dict(payload)
    )
    publish_run_events(run.pk, event.seq)
    return event


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
    run.status = to
    for name, value in fields.items():
        setattr(run, name, value)
    if to in Run.FINAL:
        run.finished_at = timezone.now()
    settles = to in Run.FINAL or to == S.NEEDS_RECONCILIATION
    if settles and "failure_reason" not in fields and reason and not run.failure_reason:
        run.failure_reason = reason
    _event(run, "status", {"from": before, "to": to, "reason": reason})
    run.save()
    audit_record(
        action=f"run.{to}",
        object_type="run",
        object_id=run.pk,
        actor=actor,
        actor_kind=None if actor else AuditEvent.ActorKind.RUNNER,
        before={"status": before},
        after={"status": to, **({"reason": reason} if reason else {})},
        run_id=run.pk,
        extra=audit_extra,
    )
    return run


# Launch ---------------------------------------------------------------------------------------


def coerce_inputs(version: WorkflowVersion, raw: Mapping[str, Any]) -> dict[str, Any]:
    """Typed launch values as JSON-safe strings (money keeps its two decimals)."""
    document = version.document or {}
    errors: dict[str, list[str]] = {}
    values: dict[str, Any] = {}
    for data in document.get("parameters", []):
        parameter = Parameter.model_validate(data)
        try:
            value = parameter.coerce(raw.get(parameter.name))
        except ValueError as exc:
            errors.setdefault(parameter.name, []).append(str(exc))
            continue
        values[parameter.name] = value if isinstance(value, bool | None) else str(value)
    unknown = set(raw) - {p.get("name") for p in document.get("parameters", [])}
    for name in sorted(unknown):
        errors.setdefault("__all__", []).append(f"'{name}' is not a parameter of this workflow")
    if errors:
        raise RunError("invalid inputs", errors)
    return values


def run_launch(
    *,
    workflow_id: int,
    user: User,
    raw_inputs: Mapping[str, Any],
    idempotency_key: str = "",
) -> Run:
    """Queue a run of the workflow's latest published version.

    Idempotent per (user, key): launching again with the same key returns the same run.
    """
    key = idempotency_key.strip()[:100]
    if key:
        existing = Run.objects.filter(launched_by=user, idempotency_key=key).first()
        if existing is not None:
            return _same_launch(existing, workflow_id)
    try:
        with transaction.atomic():
            return _launch(workflow_id=workflow_id, user=user, raw=raw_inputs, key=key)
    except IntegrityError:
        # Two launches with one key raced; the other one won and its run is the answer.
        existing = Run.objects.filter(launched_by=user, idempotency_key=key).first()
        if existing is None:
            raise
        return _same_launch(existing, workflow_id)


def _same_launch(run: Run, workflow_id: int) -> Run:
    if run.workflow_id != workflow_id:
        raise RunError("this idempotency key was already used for another workflow")
    return run


def _launch(*, workflow_id: int, user: User, raw: Mapping[str, Any], key: str) -> Run:
    workflow = Workflow.objects.select_for_update().get(pk=workflow_id)
    if workflow.archived:
        raise RunError("this workflow is archived")
    version = (
        workflow.versions.filter(status=WorkflowVersion.Status.PUBLISHED)
        .order_by("-number")
        .first()
    )
    if version is None:
        raise RunError("this workflow has no published version yet")
    inputs = coerce_inputs(version, raw)
    run = Run.objects.create(
        workflow=workflow,
        version=version,
        inputs=inputs,
        idempotency_key=key,
        launched_by=user,
        sandbox_backend=settings.SANDBOX_BACKEND,
    )
    _event(run, "status", {"from": "", "to": S.QUEUED, "reason": ""})
    run.save(update_fields=["last_event_seq"])
    audit_record(
        action="run.launched",
        object_type="run",
        object_id=run.pk,
        actor=user,
        after={"workflow": workflow.slug, "version": version.number, "inputs": inputs},
        run_id=run.pk,
    )
    from sessions.tasks import run_execute_task

    dispatch(run_execute_task, run_id=run.pk)
    return run


# Cancel and reap --------------------------------------------------------------------------------


def run_cancel(*, run_id: int, user: User) -> Run:
    """Stop a run: queued runs never start; active runs lose their sandbox at once.

    Idempotent: cancelling a finished run changes nothing.
    """
    from approvals.services import approval_void_pending

    with transaction.atomic():
        run = lock_run(run_id)
        if run.is_final:
            return run
        if run.status == S.NEEDS_RECONCILIATION:
            raise TransitionRefused(
                "this run needs reconciliation: say whether the action happened instead"
            )
        sandbox = run.sandbox
        reason = f"cancelled by {user.get_username()}"
        approval_void_pending(run=run, reason=reason)
        transition(
            run, S.CANCELLED, actor=user, reason=reason, cancel_requested=True, sandbox=None,
        )  # fmt: skip
    if sandbox:
        destroy_sandbox(sandbox)
    return run


def run_reap(*, stale_after: timedelta | None = None) -> list[int]:
    """Mark active runs whose worker went quiet as interrupted and destroy their sandboxes.

    A run is never re-run automatically: it may have been half way through a payment.
    """
    if stale_after is None:
        stale_after = timedelta(seconds=settings.RUN_HEARTBEAT_TIMEOUT_SECONDS)
    cutoff = timezone.now() - stale_after
    reaped = []
    candidates = Run.objects.filter(status__in=Run.ACTIVE - {S.AWAITING_APPROVAL}).filter(
        heartbeat_at__lt=cutoff
    )
    for run_id in candidates.values_list("pk", flat=True):
        with transaction.atomic():
            run = lock_run(run_id)
            if run.is_final or run.heartbeat_at is None or run.heartbeat_at >= cutoff:
                continue
            sandbox = run.sandbox
            if run.approvals.filter(intent_at__isnull=False, completed_at__isnull=True).exists():
                transition(
                    run, S.NEEDS_RECONCILIATION, sandbox=None,
                    reason="the worker stopped in the middle of an approved action, which may "
                    "have happened; check the portal",
                )  # fmt: skip
            else:
                transition(
                    run, S.INTERRUPTED,
                    reason="the worker running it stopped answering; it was not restarted",
                    sandbox=None,
                )  # fmt: skip
        if sandbox:
            destroy_sandbox(sandbox)
        reaped.append(run_id)
    return reaped


def sandbox_reap_orphans() -> list[str]:
    """Destroy this host's sandboxes (browsers and microVMs) whose deadline has passed.

    The watchdog next to each sandbox does this first; this covers a watchdog that was killed
    and a host that restarted mid-run. Run keys of what was reaped are returned.
    """
    from sessions.sandbox.local import reap_orphans

    return reap_orphans()


def run_reconcile(*, run_id: int, user: User, happened: bool, note: str) -> Run:
    """A person's word on an approved action whose end was never recorded.

    ``happened`` after checking the portal: the run ends succeeded when the action was its last
    step, failed otherwise (the rest is not run: the browser is gone); not happened: cancelled.
    """
    from approvals.models import ApprovalRequest

    note = note.strip()
    if not note:
        raise RunError("say what you checked", {"note": ["This field is required."]})
    with transaction.atomic():
        run = lock_run(run_id)
        if run.status != S.NEEDS_RECONCILIATION:
            raise TransitionRefused("this run does not need reconciliation")
        approval = ApprovalRequest.objects.select_for_update().get(
            run=run, intent_at__isnull=False, completed_at__isnull=True
        )
        steps = (run.version.document or {}).get("steps", [])
        who = user.get_username()
        if happened:
            approval.completed_at = timezone.now()
            approval.save(update_fields=["completed_at"])
            last = approval.step_index == len(steps) - 1
            to = S.SUCCEEDED if last else S.FAILED
            reason = (
                ""
                if last
                else f"{who} confirmed step {approval.step_index + 1} happened; the steps after "
                "it were not run"
            )
        else:
            to, reason = S.CANCELLED, f"{who} confirmed the action did not happen"
        transition(
            run, to, actor=user, reason=reason, failure_reason=reason,
            audit_extra={"reconciled": {"happened": happened, "note": note,
                                        "approval": approval.pk}},
        )  # fmt: skip
    return run


def destroy_sandbox(data: dict[str, Any]) -> None:
    from sessions.sandbox import Sandbox, get_backend

    proxy = _live_proxy(str(data.get("run_key", "")))
    if proxy is not None:  # the run waited here; nothing will go through its proxy again
        proxy.stop()

    sandbox = Sandbox.from_dict(data)
    if sandbox.host != socket.gethostname():
        from sessions.tasks import sandbox_destroy_task

        sandbox_destroy_task.apply_async(kwargs={"sandbox": data}, queue=host_queue(sandbox.host))
        return
    try:
        get_backend(sandbox.backend).destroy(sandbox)
    except Exception:  # a sandbox that is already gone must not stop a cancel
        logger.exception("destroying sandbox %s failed", sandbox.run_key)


def host_queue(host: str) -> str:
    """The Celery queue that reaches the workers of one machine (sandboxes live on one host)."""
    return f"host.{host}"


# Execution ----------------------------------------------------------------------------------------


def run_files_dir(run_id: int) -> Path:
    return Path(settings.RUN_FILES_DIR) / str(run_id)


class _Sink:
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

    def action_finished(self, index: int) -> None:
        self._write_now("completion")

    def _write_now(self, phase: str) -> None:
        """Persist on the writer thread, after everything queued before, and wait for it."""
        if self.approval_id is None:
            raise RuntimeError("no approval is attached to this run's continuation")
        done: queue.Queue[BaseException | None] = queue.Queue()
        self._queue.put(("action", (phase, done)))
        error = done.get()
        if error is not None:
            raise error

    def request_stop(self, reason: str) -> None:
        self._stop_reason = reason

    def close(self) -> None:
        """Wait until everything reported so far is in the database."""
        self._queue.put(None)
        self._writer.join()

    def _write(self) -> None:
        try:
            while (item := self._queue.get()) is not None:
                kind, payload = item
                if kind == "action":
                    phase, done = payload
                    try:
                        assert self.approval_id is not None
                        run_record_action(
                            run_id=self.run_id, approval_id=self.approval_id, phase=phase
                        )
                    except BaseException as exc:
                        done.put(exc)
                    else:
                        done.put(None)
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


def run_execute(*, run_id: int) -> None:
    """Execute a queued run until it ends or waits for a person (the body of the run task).
    Not re-entrant: a run that is no longer queued (cancelled, or claimed by another worker) is
    left alone."""
    with transaction.atomic():
        run = lock_run(run_id)
        if run.status != S.QUEUED:
            return
        version = run.version
        document = version.document or {}
        run_settings = document.get("settings", {})
        ttl = timedelta(minutes=int(run_settings.get("run_ttl_minutes", 15)))
        now = timezone.now()
        transition(
            run, S.STARTING, worker=_worker_name(),
            heartbeat_at=now, started_at=now, deadline_at=now + ttl,
        )  # fmt: skip
    # Imported here: the browser machinery is only needed where runs execute.
    from sessions.proxy import EgressPolicy, EgressProxy
    from sessions.sandbox import SandboxError, SandboxSpec, get_backend

    sink = _Sink(run_id)
    fork = None
    if document.get("session"):
        picked = _fork_for(run_id, sink)
        if isinstance(picked, str):
            sink.close()
            _finish(run_id, S.FAILED, picked)
            return
        fork = picked
    proxy = EgressProxy(EgressPolicy(run_settings.get("allowed_hosts", [])), on_denied=sink.denied)
    proxy.start()
    try:
        backend = get_backend(run.sandbox_backend)
        spec = SandboxSpec(
            run_key=f"run-{run_id}-{secrets.token_hex(4)}",
            proxy_url=proxy.url,
            ttl_seconds=ttl.total_seconds() + 30,
            restore_from=fork.restore_from if fork else "",
        )
        sandbox = backend.create(spec)
    except SandboxError as exc:
        sink.close()
        proxy.stop()
        _finish(run_id, S.FAILED, f"the browser sandbox did not start: {exc}")
        return
    record = {**sandbox.to_dict(), "owner": _owner()}
    facts = _sandbox_facts(sandbox, fork)
    with transaction.atomic():
        run = lock_run(run_id)
        started = not run.is_final  # not cancelled while the sandbox started
        if started:
            transition(
                run, S.RUNNING, sandbox=record,
                sandbox_ready_seconds=sandbox.ready_seconds, sandbox_facts=facts,
                session_template_id=fork.template_id if fork else None,
                audit_extra={"sandbox": sandbox.backend, "ready_seconds": sandbox.ready_seconds,
                             "details": sandbox.details,
                             **({"session_template": fork.template_id} if fork else {})},
            )  # fmt: skip
    if not started:
        sink.close()
        _release(run_id, record, proxy)
        return
    _drive(run_id, record, proxy, sink, start_index=0, approval=None, fork=fork)


def _sandbox_facts(sandbox: Any, fork: _Fork | None) -> dict[str, Any]:
    """What the run page shows about the browser's isolation; the sandbox record itself is gone
    once the run ends."""
    facts: dict[str, Any] = {"backend": sandbox.backend, "ready_seconds": sandbox.ready_seconds}
    for key in _SANDBOX_FACTS:
        if sandbox.details.get(key):
            facts[key] = sandbox.details[key]
    if "start" not in facts:
        facts["start"] = (
            "fresh browser, session template's cookies and local storage loaded"
            if fork
            else "fresh browser"
        )
    return facts


_SANDBOX_FACTS = (
    "isolation", "isolation_warning", "accelerator", "accelerator_warning", "start", "time_scale",
)  # fmt: skip


def run_continue(*, run_id: int, approval_id: int) -> None:
    """Go on with a run after its gate was approved (the body of the continuation task).

    Runs on the worker process that holds the run's browser and proxy. Exactly once per
    approval: the first call marks the approval continued, any later call does nothing.
    """
    from approvals.models import ApprovalRequest

    with transaction.atomic():
        run = lock_run(run_id)
        approval = ApprovalRequest.objects.select_for_update().get(pk=approval_id, run=run)
        if (
            run.status != S.RUNNING
            or approval.status != ApprovalRequest.Status.APPROVED
            or approval.continued_at is not None
        ):
            return
        approval.continued_at = timezone.now()
        approval.save(update_fields=["continued_at"])
        record = run.sandbox or {}
        proxy = _live_proxy(record.get("run_key", ""))
        if proxy is None or record.get("owner") != _owner():
            # The process that held this run's browser and proxy is gone: the browser has no
            # way out any more, and nothing was done. Fail closed.
            transition(
                run, S.INTERRUPTED, sandbox=None,
                reason="the worker holding this run's browser stopped; the approved step was "
                "not performed",
            )  # fmt: skip
            stale = record
        else:
            stale = None
            run.worker = _worker_name()
            run.heartbeat_at = timezone.now()
            run.save(update_fields=["worker", "heartbeat_at"])
    if stale is not None:
        if stale:
            destroy_sandbox(stale)
        return
    sink = _Sink(run_id)
    proxy.on_denied = sink.denied
    _drive(run_id, record, proxy, sink, start_index=approval.step_index, approval=approval)


def _drive(
    run_id: int,
    record: dict[str, Any],
    proxy: Any,
    sink: _Sink,
    *,
    start_index: int,
    approval: Any,
    fork: _Fork | None = None,
) -> None:
    """Run the runner against a started sandbox and settle what it reports."""
    from sessions.runner import Runner, RunPlan, SessionCheck
    from sessions.sandbox import Sandbox

    sandbox = Sandbox.from_dict(record)
    beat = _Heartbeat(run_id, sink)
    keep = False
    try:
        run = Run.objects.select_related("version").get(pk=run_id)
        document = run.version.document or {}
        run_settings = document.get("settings", {})
        steps = document.get("steps", [])
        # Only what the run's own steps type: a run forked from a session template never
        # reads the credential its template logged in with.
        scoped = set(run_settings.get("credentials", [])) & credentials_used(steps)
        with transaction.atomic():
            secrets_for_run = _secrets_for(run, sorted(scoped))
        beat.start()
        session = document.get("session") or {}
        plan = RunPlan(
            steps=steps,
            inputs=run.inputs,
            secrets=secrets_for_run,
            step_budget=int(run_settings.get("step_budget", 50)) - run.steps_executed,
            deadline=run.deadline_at.timestamp() if run.deadline_at else 0.0,
            artifacts_dir=run_files_dir(run_id) / "artifacts",
            start_index=start_index,
            outputs=dict(run.outputs),
            approved_index=approval.step_index if approval is not None else None,
            approved_evidence=approval.evidence if approval is not None else None,
            time_scale=float(sandbox.details.get("time_scale") or 1.0),
            session=SessionCheck(url=session["check_url"], logged_in=session["logged_in"])
            if fork
            else None,
            storage_state=fork.storage_state if fork else None,
        )
        sink.approval_id = approval.pk if approval is not None else None
        try:
            outcome = Runner(plan, sink).run(
                sandbox.cdp_url, artifacts_dir=sandbox.details.get("artifacts_dir")
            )
        except Exception as exc:  # the browser died under us, or Playwright lost it
            logger.exception("run %s crashed", run_id)
            sink.close()
            _crashed(run_id, f"the browser stopped unexpectedly: {str(exc)[:300]}")
            return
        sink.close()
        keep = _settle(run_id, outcome, sandbox, proxy, previous=approval, fork=fork)
    finally:
        beat.stop()
        if not keep:
            _release(run_id, record, proxy)
        for conn in connections.all(initialized_only=True):
            conn.close()


def _settle(
    run_id: int, outcome: Any, sandbox: Any, proxy: Any, *, previous: Any, fork: _Fork | None
) -> bool:
    """Record how the runner stopped; True when the run now waits with its browser alive."""
    if outcome.session_stale and fork is not None:
        # Never logged in again behind anyone's back: the run fails and the template waits for
        # a person to re-bake it, both in one transaction.
        _finish(
            run_id, S.FAILED, outcome.reason, quiet_denials=proxy.quiet_denied_count,
            stale=(fork.template_id, f"run #{run_id}: {outcome.session_stale}"),
        )  # fmt: skip
        return False
    if outcome.status == "approval_required":
        return _await_approval(run_id, outcome, sandbox, proxy, previous=previous)
    if outcome.status == "action_uncertain":
        _crashed(run_id, outcome.reason, failure_step=outcome.failed_step, outputs=outcome.outputs)
        return False
    status = {
        "succeeded": S.SUCCEEDED,
        "failed": S.FAILED,
        "cancelled": S.CANCELLED,
        "expired": S.EXPIRED,
    }[outcome.status]
    _finish(
        run_id, status, outcome.reason, failure_step=outcome.failed_step,
        outputs=outcome.outputs, quiet_denials=proxy.quiet_denied_count,
    )  # fmt: skip
    return False


def _await_approval(run_id: int, outcome: Any, sandbox: Any, proxy: Any, *, previous: Any) -> bool:
    from approvals.services import approval_open
    from sessions.sandbox import SandboxError, get_backend

    with transaction.atomic():
        run = lock_run(run_id)
        if run.is_final:
            return False
        run.outputs = outcome.outputs
        approval = approval_open(run=run, gate=outcome.gate, previous=previous)
        transition(run, S.AWAITING_APPROVAL, reason=outcome.reason)
    # The browser idles until the decision; the time waiting does not count against the run's
    # own time limit, so its dead-man's switch moves past the approval's expiry.
    remaining = max(0.0, run.deadline_at.timestamp() - time.time()) if run.deadline_at else 0.0
    try:
        get_backend(sandbox.backend).extend(
            sandbox, approval.expires_at.timestamp() + remaining + 60
        )
    except SandboxError as exc:
        run_fail_waiting(run_id=run_id, reason=f"the browser was lost while waiting: {exc}")
        return False
    proxy.on_denied = lambda attempt: _record_denial_now(run_id, attempt)
    _keep_proxy(run_id, sandbox.run_key, proxy)
    return True


def run_fail_waiting(*, run_id: int, reason: str) -> None:
    """A waiting run that can no longer continue: its approval is voided, the run fails."""
    from approvals.services import approval_void_pending

    with transaction.atomic():
        run = lock_run(run_id)
        if run.is_final:
            return
        approval_void_pending(run=run, reason=reason)
        record = run.sandbox
        transition(run, S.FAILED, reason=reason, sandbox=None)
    if record:
        destroy_sandbox(record)


def _crashed(run_id: int, reason: str, **fields: Any) -> None:
    """The runner stopped abnormally. If it was inside an approved irreversible action, the
    action may have happened: a person reconciles it; otherwise the run failed."""
    from approvals.models import ApprovalRequest

    with transaction.atomic():
        run = lock_run(run_id)
        if run.is_final or run.status == S.NEEDS_RECONCILIATION:
            return
        open_action = ApprovalRequest.objects.filter(
            run=run, intent_at__isnull=False, completed_at__isnull=True
        ).exists()
        outputs = fields.pop("outputs", None)
        if outputs is not None:
            run.outputs = outputs
        if open_action:
            transition(
                run, S.NEEDS_RECONCILIATION, sandbox=None,
                reason=f"{reason} — the approved action may have happened; check the portal",
                **fields,
            )  # fmt: skip
        else:
            transition(run, S.FAILED, reason=reason, sandbox=None, **fields)


def _secrets_for(run: Run, names: list[str]) -> dict[str, dict[str, str]]:
    """Decrypt the workflow's credentials for this run; each use is audited, never the value."""
    return _open_credentials(names, run_id=run.pk)


def _finish(run_id: int, status: str, reason: str, **fields: Any) -> None:
    quiet = fields.pop("quiet_denials", 0)
    stale = fields.pop("stale", None)
    with transaction.atomic():
        run = lock_run(run_id)
        if run.is_final:
            return
        if stale is not None:
            template_mark_stale(template_id=stale[0], reason=stale[1], run_id=run_id)
        if status == S.SUCCEEDED:
            reason = ""
        outputs = fields.pop("outputs", None)
        if outputs is not None:
            run.outputs = outputs
        if quiet:
            _event(run, "egress_quiet", {"count": quiet})
        transition(run, status, reason=reason, sandbox=None, **fields)


# Session templates ------------------------------------------------------------------------------
#
# A workflow's ``session`` block logs in once per bake; runs fork the result. A template is baked
# on request (a person, the schedule, or the first run of a version that never had one), goes
# ready, and is forked until a run finds it logged out (stale) or a newer bake retires it. A stale
# or failed template is never re-baked on its own: a person looks first (a changed password
# retried on every run locks the account).

T = SessionTemplate.Status
# A request nobody started within this long (its task was lost) gives way to a new one.
BAKE_START_PATIENCE = timedelta(hours=1)


class TemplateError(Exception):
    """A bake that cannot be requested; the message is for people."""


@dataclass(frozen=True)
class _Fork:
    """What a run takes from the template it forks: decrypted only in the worker that uses it."""

    template_id: int
    storage_state: dict[str, Any] | None
    restore_from: str


@dataclass(frozen=True)
class _Capture:
    state: str  # the sealed storage state, or ''
    state_path: str  # a saved VM, or ''
    host: str


class _BakeFailed(Exception):
    pass


def lock_template(template_id: int) -> SessionTemplate:
    return SessionTemplate.objects.select_for_update().get(pk=template_id)


def templates_dir() -> Path:
    """Where saved VMs of session templates live (next to the runs' files)."""
    return Path(settings.RUN_FILES_DIR).parent / "session-templates"


def _template_audit(
    template: SessionTemplate,
    action: str,
    *,
    actor: User | None = None,
    actor_kind: AuditEvent.ActorKind | None = None,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
    run_id: int | None = None,
) -> None:
    version = template.version
    audit_record(
        action=f"session_template.{action}",
        object_type="session_template",
        object_id=template.pk,
        actor=actor,
        actor_kind=actor_kind,
        before=before,
        after={"status": template.status, **(after or {})},
        run_id=run_id,
        extra={
            "workflow": version.workflow.slug,
            "version": version.number,
            "backend": template.backend,
        },
    )


def _snapshots_whole_vm(backend: str) -> bool:
    from sessions.sandbox import get_backend

    return callable(getattr(get_backend(backend), "snapshot", None))


def template_request_bake(
    *, version_id: int, user: User | None, backend: str, host: str = ""
) -> SessionTemplate:
    """Queue a bake of a published version's session template for ``backend`` (``user`` None:
    the schedule; ``host`` names the machine that must bake a saved-VM template).

    Idempotent while one is baking: that template is returned and nothing more is queued.
    Raises TemplateError when the version has no session block or its workflow is archived.
    """
    with transaction.atomic():
        template, created = _request_bake(
            version_id=version_id, user=user, backend=backend, host=host
        )
        if created:
            from sessions.tasks import session_template_bake_task

            dispatch(
                session_template_bake_task,
                template_id=template.pk,
                queue=host_queue(host) if host else None,
            )
    return template


def _request_bake(
    *, version_id: int, user: User | None, backend: str, host: str, run_id: int | None = None
) -> tuple[SessionTemplate, bool]:
    version = WorkflowVersion.objects.select_related("workflow").get(pk=version_id)
    if version.status != WorkflowVersion.Status.PUBLISHED or not (version.document or {}).get(
        "session"
    ):
        raise TemplateError(f"version {version.number or 'draft'} has no session template")
    if version.workflow.archived:
        raise TemplateError("this workflow is archived")
    baking = SessionTemplate.objects.filter(
        version=version, backend=backend, host=host, status=T.BAKING
    )
    existing = baking.first()
    if existing is not None:
        return existing, False
    try:
        with transaction.atomic():
            template = SessionTemplate.objects.create(
                version=version, backend=backend, host=host, requested_by=user
            )
    except IntegrityError:
        # Another request won the race (the one-bake-at-a-time constraint); its bake is ours.
        return baking.get(), False
    _template_audit(
        template,
        "bake_requested",
        actor=user,
        after={"host": host, "for_run": run_id} if run_id else {"host": host},
        run_id=run_id,
    )
    return template, True


def template_bake(*, template_id: int, run_id: int | None = None) -> SessionTemplate:
    """Bake a requested template (the body of the bake task; a run whose version never had a
    template calls it inline): in a fresh sandbox behind the workflow's egress proxy, run the
    session steps with the credentials, check the logged-in element, then save the whole VM
    (backends with ``snapshot``) or capture the storage state, encrypted.

    Not re-entrant: only the first call claims the template; a later one (a redelivered task)
    returns it as it is.
    """
    claimed = SessionTemplate.objects.filter(
        pk=template_id, status=T.BAKING, bake_started_at__isnull=True
    ).update(bake_started_at=timezone.now())
    template = SessionTemplate.objects.select_related("version__workflow").get(pk=template_id)
    if claimed != 1:
        return template
    try:
        capture = _bake(template, run_id=run_id)
    except _BakeFailed as exc:
        return _bake_failed(template_id, str(exc), run_id=run_id)
    return _bake_ready(template_id, capture, run_id=run_id)


def _bake(template: SessionTemplate, *, run_id: int | None) -> _Capture:
    from sessions.proxy import EgressPolicy, EgressProxy
    from sessions.runner import Runner, RunPlan, SessionCheck
    from sessions.sandbox import SandboxError, SandboxSpec, get_backend

    document = template.version.document or {}
    session = document["session"]
    run_settings = document.get("settings", {})
    ttl = int(run_settings.get("run_ttl_minutes", 15)) * 60
    names = sorted(set(run_settings.get("credentials", [])) & credentials_used(session["steps"]))
    try:
        backend = get_backend(template.backend)
    except SandboxError as exc:
        raise _BakeFailed(str(exc)) from None
    snapshot = getattr(backend, "snapshot", None)
    proxy = EgressProxy(
        EgressPolicy(run_settings.get("allowed_hosts", [])),
        on_denied=lambda attempt: logger.debug(
            "session template %s: egress to %s refused", template.pk, attempt.host
        ),
    )
    proxy.start()
    sandbox = None
    typed: list[str] = []
    try:
        sandbox = backend.create(
            SandboxSpec(
                run_key=f"bake-{template.pk}-{secrets.token_hex(4)}",
                proxy_url=proxy.url,
                ttl_seconds=ttl + 30,
            )
        )
        with transaction.atomic():
            credentials = _open_credentials(names, run_id=run_id, template_id=template.pk)
        typed = [value for fields in credentials.values() for value in fields.values() if value]
        plan = RunPlan(
            steps=session["steps"],
            inputs={},
            secrets=credentials,
            step_budget=len(session["steps"]),
            deadline=time.time() + ttl,
            artifacts_dir=templates_dir() / f"{template.pk}-files",
            time_scale=float(sandbox.details.get("time_scale") or 1.0),
            session=SessionCheck(url=session["check_url"], logged_in=session["logged_in"]),
            baking=True,
            capture_state=snapshot is None,
        )
        outcome = Runner(plan, _BakeSink()).run(
            sandbox.cdp_url, artifacts_dir=sandbox.details.get("artifacts_dir")
        )
        if outcome.status != "succeeded":
            where = f"session step '{outcome.failed_step}': " if outcome.failed_step else ""
            raise _BakeFailed(where + outcome.reason)
        if snapshot is None:
            sealed = vault().seal({"storage_state": json.dumps(outcome.storage_state)})
            return _Capture(state=sealed, state_path="", host="")
        destination = templates_dir() / f"template-{template.pk}.vm"
        destination.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        saving, sandbox = sandbox, None  # saving the VM ends it
        snapshot(saving, destination)
        return _Capture(state="", state_path=str(destination), host=socket.gethostname())
    except _BakeFailed:
        raise
    except SandboxError as exc:
        raise _BakeFailed(f"the browser sandbox failed: {_masked(str(exc), typed)}") from None
    except Exception as exc:  # the browser died under us, or Playwright lost it
        logger.exception("baking session template %s crashed", template.pk)
        reason = _masked(str(exc)[:300], typed)
        raise _BakeFailed(f"the browser stopped unexpectedly: {reason}") from None
    finally:
        if sandbox is not None:
            try:
                backend.destroy(sandbox)
            except Exception:  # a sandbox that is already gone must not hide the outcome
                logger.exception("destroying bake sandbox %s failed", sandbox.run_key)
        proxy.stop()


def _masked(text: str, typed: list[str]) -> str:
    from sessions.runner import MASK

    for value in sorted(typed, key=len, reverse=True):
        text = text.replace(value, MASK)
    return text


class _BakeSink:
    """A bake's steps are not a run's: nothing is kept of them but how they ended."""

    def step_finished(self, record: Any) -> None:
        pass

    def action_starting(self, index: int) -> None:
        raise RuntimeError("session templates have no irreversible steps")

    def action_finished(self, index: int) -> None:
        raise RuntimeError("session templates have no irreversible steps")

    def stop_reason(self) -> str | None:
        return None


def _open_credentials(
    names: list[str], *, run_id: int | None, template_id: int | None = None
) -> dict[str, dict[str, str]]:
    """Decrypt credentials for a run or a bake; each use is audited, never the value."""
    box = vault()
    values = {}
    for credential in Credential.objects.filter(name__in=names).order_by("name"):
        values[credential.name] = box.open(credential.ciphertext)
        audit_record(
            action="credential.used",
            object_type="credential",
            object_id=credential.pk,
            actor_kind=AuditEvent.ActorKind.RUNNER,
            after={"name": credential.name},
            run_id=run_id,
            extra={"session_template": template_id} if template_id else None,
        )
    return values


def _bake_ready(template_id: int, capture: _Capture, *, run_id: int | None) -> SessionTemplate:
    key = SessionTemplate.objects.values("version_id", "backend").get(pk=template_id)
    with transaction.atomic():
        # One order for every lock: by primary key (the templates this bake replaces are older).
        rows = list(
            SessionTemplate.objects.select_for_update()
            .select_related("version__workflow")
            .filter(**key, pk__lte=template_id)
            .filter(
                Q(pk=template_id) | Q(status__in=(T.READY, T.STALE, T.FAILED), host=capture.host)
            )
            .order_by("pk")
        )
        *replaced, template = rows
        if template.status != T.BAKING:
            # Given up on while it baked (see _fail_abandoned_bakes): the capture is not used.
            _discard_state_file(capture.state_path, capture.host)
            return template
        template.status = T.READY
        template.state = capture.state
        template.state_path = capture.state_path
        template.host = capture.host
        template.baked_at = timezone.now()
        template.save()
        _template_audit(
            template,
            "baked",
            actor_kind=AuditEvent.ActorKind.RUNNER,
            before={"status": T.BAKING},
            after={
                "snapshot": "saved VM" if capture.state_path else "storage state (encrypted)",
                "host": capture.host,
            },
            run_id=run_id,
        )
        for old in replaced:
            _retire(old, reason=f"replaced by session template #{template.pk}")
    return template


def _bake_failed(template_id: int, reason: str, *, run_id: int | None) -> SessionTemplate:
    with transaction.atomic():
        template = lock_template(template_id)
        if template.status != T.BAKING:
            return template
        template.status = T.FAILED
        template.failure_reason = reason
        template.ended_at = timezone.now()
        template.save(update_fields=["status", "failure_reason", "ended_at"])
        _template_audit(
            template,
            "bake_failed",
            actor_kind=AuditEvent.ActorKind.RUNNER,
            before={"status": T.BAKING},
            after={"reason": reason},
            run_id=run_id,
        )
    return template


def template_mark_stale(
    *, template_id: int, reason: str, run_id: int | None = None
) -> SessionTemplate:
    """A fork woke up logged out: the template is stale until a person re-bakes it, and its
    state (useless now, still secret) is dropped. Idempotent: a template that is not ready is
    left as it is. Inside the caller's transaction when there is one (the run's failure)."""
    with transaction.atomic():
        template = lock_template(template_id)
        if template.status != T.READY:
            return template
        template.status = T.STALE
        template.stale_reason = reason
        template.ended_at = timezone.now()
        _drop_state(template)
        template.save()
        _template_audit(
            template,
            "stale",
            actor_kind=AuditEvent.ActorKind.RUNNER,
            before={"status": T.READY},
            after={"reason": reason},
            run_id=run_id,
        )
    return template


def template_retire(*, template_id: int, reason: str) -> SessionTemplate:
    """Stop using a template and drop its state. Idempotent."""
    with transaction.atomic():
        template = lock_template(template_id)
        if template.status not in (T.READY, T.STALE, T.FAILED):
            return template
        _retire(template, reason=reason)
    return template


def _retire(template: SessionTemplate, *, reason: str) -> None:
    """Retire a locked template (in the caller's transaction)."""
    before = template.status
    template.status = T.RETIRED
    template.ended_at = timezone.now()
    _drop_state(template)
    template.save()
    _template_audit(template, "retired", before={"status": before}, after={"reason": reason})


def _drop_state(template: SessionTemplate) -> None:
    """Forget a locked template's snapshot; a saved VM's file goes once the change commits."""
    path, host = template.state_path, template.host
    template.state = ""
    template.state_path = ""
    if path:
        transaction.on_commit(lambda: _discard_state_file(path, host))


def _discard_state_file(path: str, host: str) -> None:
    if not path:
        return
    if host and host != socket.gethostname():
        from sessions.tasks import session_template_discard_task

        session_template_discard_task.apply_async(kwargs={"path": path}, queue=host_queue(host))
        return
    template_discard_state(path=path)


def template_discard_state(*, path: str) -> None:
    """Delete a saved VM (and its metadata file) of a session template. Idempotent; refuses any
    path outside the templates directory."""
    target = Path(path).resolve()
    if not target.is_relative_to(templates_dir().resolve()):
        logger.warning("not deleting %s: outside the session templates directory", path)
        return
    for file in (target, target.with_name(target.name + ".json")):
        with contextlib.suppress(FileNotFoundError):
            file.unlink()


@transaction.atomic
def template_states_reencrypt() -> int:
    """Re-encrypt the saved login of every ready session template with the newest vault key
    (key rotation, next to ``credentials_reencrypt``). Idempotent; all or nothing: a state that
    no configured key opens raises VaultError."""
    box = vault()
    count = 0
    ready = SessionTemplate.objects.select_for_update().filter(status=T.READY).exclude(state="")
    for template in ready.order_by("pk"):
        template.state = box.rotate(template.state)
        template.save(update_fields=["state"])
        count += 1
    if count:
        audit_record(
            action="session_template.keys_rotated",
            object_type="session_template",
            object_id="*",
            after={"templates": count, "keys_configured": len(settings.CREDENTIAL_KEYS)},
        )
    return count


def template_rebake_due() -> list[int]:
    """The schedule (Celery beat; the housekeeping thread in the embedded default): ready
    templates older than their version's ``rebake_every_hours`` get a new bake, templates of a
    version that is no longer its live workflow's latest are retired, and bakes whose worker
    went quiet fail. Idempotent. Returns the templates whose bake it queued."""
    now = timezone.now()
    _fail_abandoned_bakes(now)
    latest: dict[int, int | None] = {}
    queued = []
    ready = SessionTemplate.objects.filter(status=T.READY).select_related("version__workflow")
    for template in ready.order_by("pk"):
        version = template.version
        workflow = version.workflow
        if workflow.pk not in latest:
            latest[workflow.pk] = (
                workflow.versions.filter(status=WorkflowVersion.Status.PUBLISHED)
                .order_by("-number")
                .values_list("pk", flat=True)
                .first()
            )
        if workflow.archived or latest[workflow.pk] != version.pk:
            why = "the workflow is archived" if workflow.archived else "a newer version exists"
            template_retire(template_id=template.pk, reason=why)
            continue
        hours = int(((version.document or {}).get("session") or {}).get("rebake_every_hours", 12))
        if template.baked_at is None or template.baked_at + timedelta(hours=hours) > now:
            continue
        with transaction.atomic():
            fresh, created = _request_bake(
                version_id=version.pk, user=None, backend=template.backend, host=template.host
            )
            if created:
                from sessions.tasks import session_template_bake_task

                dispatch(
                    session_template_bake_task,
                    template_id=fresh.pk,
                    queue=host_queue(template.host) if template.host else None,
                )
                queued.append(fresh.pk)
    return queued


def _fail_abandoned_bakes(now: Any) -> None:
    for template in SessionTemplate.objects.filter(status=T.BAKING).select_related("version"):
        ttl = int(
            ((template.version.document or {}).get("settings") or {}).get("run_ttl_minutes", 15)
        )
        if template.bake_started_at is not None:
            if template.bake_started_at + timedelta(minutes=ttl + 5) < now:
                _bake_failed(template.pk, "the worker baking it stopped answering", run_id=None)
        elif template.created_at + BAKE_START_PATIENCE < now:
            _bake_failed(template.pk, "no worker started the bake", run_id=None)


def _fork_for(run_id: int, sink: _Sink) -> _Fork | str:
    """The template a starting run forks, or why it cannot start. The newest ready template is
    forked; one being baked is waited for; a stale or failed one fails the run (a person
    re-bakes it); a version that never had one is baked here, inline: the only time the login
    is on a run's path."""
    beat = _Heartbeat(run_id, sink)  # the reaper must not take a long bake for a dead worker
    beat.start()
    try:
        return _pick_or_bake(run_id)
    finally:
        beat.stop()


def _pick_or_bake(run_id: int) -> _Fork | str:
    from sessions import selectors
    from sessions.runner import STALE_SESSION
    from sessions.sandbox import SandboxError

    here = socket.gethostname()
    run = Run.objects.select_related("version", "launched_by").get(pk=run_id)
    backend = run.sandbox_backend
    while True:
        state = Run.objects.filter(pk=run_id).values("status", "cancel_requested").get()
        if state["cancel_requested"] or state["status"] in Run.FINAL:
            return "the run was cancelled while its session template was baked"
        if run.deadline_at is not None and timezone.now() >= run.deadline_at:
            return "the run's time limit was reached while its session template was baked"
        template = selectors.session_template_pick(
            version_id=run.version_id, backend=backend, hosts=("", here)
        )
        if template is None:
            try:
                host = here if _snapshots_whole_vm(backend) else ""
                with transaction.atomic():
                    fresh, created = _request_bake(
                        version_id=run.version_id, user=run.launched_by, backend=backend,
                        host=host, run_id=run_id,
                    )  # fmt: skip
                    if created:
                        locked = lock_run(run_id)
                        _event(
                            locked, "session_template", {"phase": "baking", "template": fresh.pk}
                        )
                        locked.save(update_fields=["last_event_seq"])
            except (TemplateError, SandboxError) as exc:
                return f"the session template cannot be baked: {exc}"
            if created:
                template_bake(template_id=fresh.pk, run_id=run_id)
            continue
        if template.status == T.BAKING:
            time.sleep(1.0)
            continue
        if template.status == T.STALE:
            return STALE_SESSION
        if template.status == T.FAILED:
            return f"the session template could not be baked ({template.failure_reason}) — re-bake"
        try:
            storage = (
                json.loads(vault().open(template.state)["storage_state"])
                if template.state
                else None
            )
        except (VaultError, KeyError, ValueError):
            return "the session template's state cannot be decrypted — re-bake"
        return _Fork(
            template_id=template.pk, storage_state=storage, restore_from=template.state_path
        )


# The browser's host-side companions -------------------------------------------------------------
#
# A run's egress proxy is a thread of the process that started its browser. While the run waits
# for a person the proxy stays up in that process, so the continuation must run there too: the
# sandbox record names its owner (Celery node and pid) and the decision routes the continuation
# to that node's own queue (in the embedded default, the same process's thread pool).

# sandbox run_key → (run id, proxy)
_LIVE_PROXIES: dict[str, tuple[int, Any]] = {}
_LIVE_LOCK = threading.Lock()


def _owner() -> dict[str, Any]:
    return {"node": _celery_node(), "pid": os.getpid(), "host": socket.gethostname()}


def _celery_node() -> str:
    from celery import current_task

    request = getattr(current_task, "request", None)
    return str(getattr(request, "hostname", "") or "") if current_task else ""


def _worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# Well inside RUN_HEARTBEAT_TIMEOUT_SECONDS: the sweep is also the heartbeat of approved runs
# whose continuation waits in this worker's queue.
_SWEEP_SECONDS = 15.0
_sweeper: threading.Thread | None = None


def _keep_proxy(run_id: int, run_key: str, proxy: Any) -> None:
    global _sweeper
    with _LIVE_LOCK:
        _LIVE_PROXIES[run_key] = (run_id, proxy)
        if _sweeper is None or not _sweeper.is_alive():
            _sweeper = threading.Thread(target=_sweep_forever, name="proxy-sweeper", daemon=True)
            _sweeper.start()


def _sweep_forever() -> None:
    # Each process sweeps its own proxies: a run decided, cancelled or expired elsewhere leaves
    # its proxy here otherwise. The thread ends when there is nothing left to watch.
    global _sweeper
    while True:
        time.sleep(_SWEEP_SECONDS)
        with _LIVE_LOCK:
            if not _LIVE_PROXIES:
                _sweeper = None
                return
        try:
            sweep_waiting_proxies()
        except Exception:
            logger.exception("sweeping waiting proxies failed")
        finally:
            for conn in connections.all(initialized_only=True):
                conn.close()


def _live_proxy(run_key: str) -> Any:
    with _LIVE_LOCK:
        entry = _LIVE_PROXIES.pop(run_key, None)
    return entry[1] if entry else None


def _release(run_id: int, record: dict[str, Any], proxy: Any) -> None:
    destroy_sandbox(record)
    proxy.stop()


def sweep_waiting_proxies() -> int:
    """Stop the proxies of this process whose run no longer waits (decided elsewhere, expired,
    cancelled); returns how many were stopped. Called periodically.

    It also beats for approved runs whose continuation has not started yet: it may be queued
    behind busy work on this worker, and this process, which holds the run's proxy, is alive.
    The reaper interrupts such a run only when its holder stops beating (it died).
    """
    with _LIVE_LOCK:
        entries = dict(_LIVE_PROXIES)
    if not entries:
        return 0
    held = [run_id for run_id, _ in entries.values()]
    waiting = set(
        Run.objects.filter(pk__in=held)
        .exclude(status__in=Run.FINAL | {S.NEEDS_RECONCILIATION})
        .values_list("pk", flat=True)
    )
    Run.objects.filter(pk__in=held, status=S.RUNNING).update(heartbeat_at=timezone.now())
    stopped = 0
    for run_key, (run_id, _) in entries.items():
        if run_id not in waiting:
            proxy = _live_proxy(run_key)
            if proxy is not None:
                proxy.stop()
                stopped += 1
    return stopped


def _record_denial_now(run_id: int, attempt: Any) -> None:
    # On the proxy's thread, while no runner is attached to the run.
    try:
        run_record_denial(run_id=run_id, attempt=attempt)
    except Exception:
        logger.exception("recording a denial of waiting run %s failed", run_id)
    finally:
        for conn in connections.all(initialized_only=True):
            conn.close()


def run_record_action(*, run_id: int, approval_id: int, phase: str) -> None:
    """The intent to perform an approved action (``phase="intent"``), or its completion.

    Committed before the runner goes on: an intent without a completion is what tells a crash
    in the middle of a payment from one before it.
    """
    from approvals.models import ApprovalRequest

    with transaction.atomic():
        run = lock_run(run_id)
        approval = ApprovalRequest.objects.select_for_update().get(pk=approval_id, run=run)
        if run.status != S.RUNNING or run.cancel_requested:
            raise TransitionRefused(f"the run is {run.get_status_display().lower()}; not acting")
        now = timezone.now()
        if phase == "intent":
            if approval.intent_at is not None:
                raise TransitionRefused("this approved action was already started once")
            approval.intent_at = now
        else:
            approval.completed_at = now
        approval.save(update_fields=["intent_at", "completed_at"])
        _event(run, f"action_{phase}", {"approval": approval.pk, "step": approval.step_id})
        run.save(update_fields=["last_event_seq"])
        audit_record(
            action=f"approval.action_{'started' if phase == 'intent' else 'completed'}",
            object_type="approval",
            object_id=approval.pk,
            actor_kind=AuditEvent.ActorKind.RUNNER,
            after={"step": approval.step_id, "evidence_sha256": approval.evidence_sha256},
            run_id=run.pk,
            approval_id=approval.pk,
        )


class _Heartbeat:
    """Tells the reaper this worker is alive while a run executes here, and tells the runner
    when the run was cancelled (checked every second, so a cancel stops it quickly)."""

    def __init__(
        self, run_id: int, sink: _Sink, interval: float = 1.0, beat_every: int = 5
    ) -> None:
        self.run_id = run_id
        self.sink = sink
        self.interval = interval
        self.beat_every = beat_every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{run_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    def _loop(self) -> None:
        ticks = 0
        try:
            while not self._stop.wait(self.interval):
                ticks += 1
                if ticks % self.beat_every == 0:
                    Run.objects.filter(pk=self.run_id, status__in=Run.ACTIVE).update(
                        heartbeat_at=timezone.now()
                    )
                state = Run.objects.filter(pk=self.run_id).values("status", "cancel_requested")
                row = state.first()
                if row is None or row["cancel_requested"] or row["status"] in Run.FINAL:
                    self.sink.request_stop("the run was cancelled")
        finally:
            for conn in connections.all(initialized_only=True):
                conn.close()


def run_record_step(*, run_id: int, record: Any) -> StepResult:
    """Persist one executed step: files (the overlay and thumbnail are drawn here, on the
    writer thread), the step row, artifacts, an event, an audit event."""
    from sessions import observation as observing

    directory = run_files_dir(run_id) / "steps"
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"{record.index + 1:03d}-{record.step_id}"
    files: dict[str, str] = {}
    overlay_jpeg = thumbnail_jpeg = None
    if record.screenshot:
        overlay_jpeg = observing.overlay(record.screenshot, record.elements)
        thumbnail_jpeg = observing.thumbnail(record.screenshot)
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
        _event(
            run, "step", {"index": record.index, "status": record.status, "step_result": result.pk}
        )
        run.save()
        audit_record(
            action="run.step_executed",
            object_type="run",
            object_id=run.pk,
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
            _event(run, "egress_denied", payload)
            run.save(update_fields=["last_event_seq"])
        audit_record(
            action="run.egress_denied",
            object_type="run",
            object_id=run.pk,
            actor_kind=AuditEvent.ActorKind.RUNNER,
            after=payload,
            run_id=run.pk,
        )


def _sha256(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()
