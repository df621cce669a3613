"""Executing a run: start, drive, wait for a person, continue, settle and finish."""

from __future__ import annotations

import logging
import socket
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from approvals.models import ApprovalRequest, Question
from approvals.questions import question_open, question_take_answer
from approvals.services import approval_open, approval_void_pending
from sessions.engine.chromium import browser_label
from sessions.engine.driver import Connection, connect_timeout_ms
from sessions.engine.plan import Answer, RunPlan, SessionCheck, secret_targets, secret_values_of
from sessions.engine.runner import Runner
from sessions.engine.sandbox.base import Sandbox, SandboxError, SandboxSpec
from sessions.engine.sandbox.egress import Egress, EgressError
from sessions.live import Filmstrip, LiveFeed
from sessions.models import Run
from sessions.services.baking import Fork, fork_for
from sessions.services.credentials import CredentialRefused, credentials_open
from sessions.services.egress import egress_dir, egress_start
from sessions.services.records import event_append, lock_run
from sessions.services.runstate import (
    S,
    destroy_sandbox,
    run_files_dir,
    sandbox_run_key,
    transition,
)
from sessions.services.sandboxes import sandbox_alive, sandbox_backend
from sessions.services.templates import template_mark_stale
from sessions.services.writer import Heartbeat, RunSink, worker_name
from workflows.schema import credentials_used

logger = logging.getLogger(__name__)

# Execution ----------------------------------------------------------------------------------------


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
        ttl = timedelta(minutes=version.settings_model.run_ttl_minutes)
        now = timezone.now()
        transition(
            run, S.STARTING, worker=worker_name(),
            heartbeat_at=now, started_at=now, deadline_at=now + ttl,
        )  # fmt: skip
    sink = RunSink(run_id)
    fork = None
    if document.get("session"):
        picked = fork_for(run_id, sink)
        if isinstance(picked, str):
            sink.close()
            _finish(run_id, S.FAILED, picked)
            return
        fork = picked
    run_key = sandbox_run_key(run_id)
    # Recorded before anything starts: a worker killed while the browser starts leaves a record
    # the reaper destroys, not a browser up until its deadline.
    pending = {
        "pending": True, "run_id": run_id, "run_key": run_key, "host": socket.gethostname(),
        "backend": run.sandbox_backend, "egress_dir": str(egress_dir(run_key)),
    }  # fmt: skip
    with transaction.atomic():
        locked = lock_run(run_id)
        if locked.is_final:
            sink.close()
            return
        locked.sandbox = pending
        locked.save(update_fields=["sandbox"])
    deadline = time.time() + ttl.total_seconds() + 30
    # A browser may take a while to start on a busy host: beat meanwhile, so the reaper does
    # not take a slow start for a dead worker.
    starting = Heartbeat(run_id, sink)
    starting.start()
    try:
        # The proxy runs in a supervisor process of its own that outlives this worker.
        proxy = egress_start(
            run_key=run_key, allowed_hosts=version.settings_model.allowed_hosts, deadline=deadline
        )
        backend = sandbox_backend(run.sandbox_backend)
        spec = SandboxSpec(
            run_key=run_key,
            proxy_url=proxy.url,
            ttl_seconds=ttl.total_seconds() + 30,
            restore_from=fork.restore_from if fork else "",
        )
        sandbox = backend.create(spec)
    except BaseException as exc:
        # Whatever stopped the start (a refusing backend, a soft time limit, a cancel that
        # removed the egress directory under it), nothing it started may outlive it.
        sink.close()
        destroy_sandbox(pending)
        if not isinstance(exc, Exception):
            raise
        reason = str(exc) if isinstance(exc, SandboxError | EgressError) else repr(exc)
        _finish(run_id, S.FAILED, f"the browser sandbox did not start: {reason}")
        return
    finally:
        starting.stop()
    record = {
        **sandbox.to_dict(), "run_id": run_id, "egress_dir": str(proxy.directory),
    }  # fmt: skip
    try:
        # A cancel during the start has removed the egress directory this writes to.
        proxy.link(sandbox.workdir)
        started = _mark_running(run_id, record, sandbox, fork)
    except BaseException as exc:
        sink.close()
        destroy_sandbox(record)
        if not isinstance(exc, Exception):
            raise
        _finish(run_id, S.FAILED, f"the browser sandbox did not start: {exc!r}")
        return
    if not started:
        sink.close()
        destroy_sandbox(record)
        return
    # A continue-from run (sessions.console_services.run_rerun) starts at its step.
    _drive(run_id, record, proxy, sink, start_index=run.start_index, approval=None, fork=fork)


def _mark_running(run_id: int, record: dict[str, Any], sandbox: Any, fork: Fork | None) -> bool:
    """Hand the started sandbox to the run; False when the run ended (a cancel) meanwhile."""
    facts = _sandbox_facts(sandbox, fork)
    with transaction.atomic():
        run = lock_run(run_id)
        if run.is_final:
            return False
        seen = (run.sandbox or {}).get("egress_seen")
        if seen:
            record["egress_seen"] = seen
        transition(
            run, S.RUNNING, sandbox=record,
            sandbox_ready_seconds=sandbox.ready_seconds, sandbox_facts=facts,
            session_template_id=fork.template_id if fork else None,
            audit_extra={"sandbox": sandbox.backend, "ready_seconds": sandbox.ready_seconds,
                         "details": sandbox.details,
                         **({"session_template": fork.template_id} if fork else {})},
        )  # fmt: skip
    return True


def _sandbox_facts(sandbox: Any, fork: Fork | None) -> dict[str, Any]:
    """What the run page shows about the browser's isolation; the sandbox record itself is gone
    once the run ends."""
    facts: dict[str, Any] = {"backend": sandbox.backend, "ready_seconds": sandbox.ready_seconds}
    for key in _SANDBOX_FACTS:
        if sandbox.details.get(key):
            facts[key] = sandbox.details[key]
    if sandbox.details.get("browser"):
        facts["browser"] = browser_label(sandbox.details["browser"])
    if "start" not in facts:
        facts["start"] = (
            "fresh browser, session template's cookies and local storage loaded"
            if fork
            else "fresh browser"
        )
    return facts


_SANDBOX_FACTS = (
    "isolation", "isolation_warning", "accelerator", "accelerator_warning", "start", "time_scale",
    "frames",
)  # fmt: skip


def run_continue(*, run_id: int, approval_id: int) -> None:
    """Go on with a run after its gate was approved (the body of the continuation task).

    Runs on any worker of the sandbox's host: the browser and its egress supervisor are
    processes of their own, reached by CDP and by their directory. Exactly once per approval:
    the first call marks the approval continued, any later call does nothing.
    """

    # Connecting to the browser takes as long as the checks below: it starts first, and nothing
    # is done with the browser unless they pass.
    seen = Run.objects.values_list("sandbox", flat=True).get(pk=run_id) or {}
    ahead = _connect_ahead(seen)
    try:
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
            lost = _claim_sandbox(run, not_done="; the approved step was not performed")
        if lost:
            if record:
                destroy_sandbox(record)
            return
        # Only a connection to the browser recorded under the lock is used.
        same = ahead is not None and record.get("cdp_url") == seen.get("cdp_url")
        sink = RunSink(run_id)
        proxy = Egress(record["egress_dir"])
        _drive(
            run_id, record, proxy, sink, start_index=approval.step_index, approval=approval,
            connection=ahead if same else None,
        )  # fmt: skip
    finally:
        if ahead is not None:
            ahead.close()  # nothing to do once the runner used it


def _connect_ahead(record: dict[str, Any]) -> Connection | None:
    """A connection to the recorded browser, being opened (None without a usable record)."""
    if not record:
        return None
    try:
        sandbox = Sandbox.from_dict(record)
    except SandboxError:
        return None  # the checks under the lock say what is wrong with it
    return Connection(
        sandbox.cdp_url,
        artifacts_dir=sandbox.details.get("artifacts_dir"),
        timeout_ms=connect_timeout_ms(float(sandbox.details.get("time_scale") or 1.0)),
    )


def run_answer_continue(*, run_id: int, question_id: int) -> None:
    """Go on with a run from its ask step once a person answered (the body of the answer task).

    Runs on any worker of the sandbox's host. Exactly once per question: the first call marks it
    continued and takes the answer (a sealed code is opened and wiped in the same transaction),
    any later call does nothing.
    """

    with transaction.atomic():
        run = lock_run(run_id)
        question = Question.objects.select_for_update().get(pk=question_id, run=run)
        if (
            run.status != S.RUNNING
            or question.status != Question.Status.ANSWERED
            or question.continued_at is not None
        ):
            return
        question.continued_at = timezone.now()
        question.save(update_fields=["continued_at"])
        answer = Answer(
            index=question.step_index,
            value=question_take_answer(question),
            answerer=question.answerer.get_username() if question.answerer else "",
        )
        record = run.sandbox or {}
        lost = _claim_sandbox(run, not_done="")
    if lost:
        if record:
            destroy_sandbox(record)
        return
    sink = RunSink(run_id)
    proxy = Egress(record["egress_dir"])
    _drive(run_id, record, proxy, sink, start_index=answer.index, approval=None, answer=answer)


def _claim_sandbox(run: Run, *, not_done: str) -> str:
    """Under the run's lock: this worker takes the waiting run's sandbox (returns ""), or, where
    the browser or its only way out is gone, the run fails closed, ``not_done`` saying what was
    not performed (returns why)."""

    record = run.sandbox or {}
    why = sandbox_alive(record, quick=True) if record else "it was never recorded"
    if why:
        transition(
            run, S.FAILED, sandbox=None,
            reason=f"the run's browser sandbox was lost while it waited ({why}){not_done}",
        )  # fmt: skip
        return why
    run.worker = worker_name()
    run.heartbeat_at = timezone.now()
    run.save(update_fields=["worker", "heartbeat_at"])
    return ""


def _drive(
    run_id: int,
    record: dict[str, Any],
    proxy: Any,
    sink: RunSink,
    *,
    start_index: int,
    approval: Any,
    fork: Fork | None = None,
    connection: Connection | None = None,
    answer: Any = None,
) -> None:
    """Run the runner against a started sandbox and settle what it reports (on ``connection``,
    to its browser opened ahead, where there is one)."""

    sandbox = Sandbox.from_dict(record)
    beat = Heartbeat(run_id, sink, spool=Path(proxy.directory))
    keep = False
    try:
        run = Run.objects.select_related("version").get(pk=run_id)
        document = run.version.document or {}
        run_settings = run.version.settings_model
        steps = document.get("steps", [])
        # Only what the run's own steps type: a run forked from a session template never
        # reads the credential its template logged in with.
        scoped = set(run_settings.credentials) & credentials_used(steps)
        try:
            with transaction.atomic():
                secrets_for_run = _secrets_for(run, sorted(scoped))
        except CredentialRefused as exc:
            sink.close()
            _finish(run_id, S.FAILED, f"not started: {exc}")
            return
        beat.start()
        session = document.get("session") or {}
        plan = RunPlan(
            steps=steps,
            inputs=run.inputs,
            secrets=secrets_for_run,
            step_budget=run_settings.step_budget - run.steps_executed,
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
            answer=answer,
            facts=tuple(run.version.decision_fact_sources),
        )
        sink.approval_id = approval.pk if approval is not None else None
        feed = _live_feed(run_id, sandbox, steps, secrets_for_run, run_settings)
        feed.start()
        try:
            runner = Runner(plan, sink, pause=feed)
            if connection is not None:
                outcome = runner.run_on(connection)
            else:
                outcome = runner.run(
                    sandbox.cdp_url, artifacts_dir=sandbox.details.get("artifacts_dir")
                )
        except Exception as exc:  # the browser died under us, or Playwright lost it
            logger.exception("run %s crashed", run_id)
            sink.close()
            _crashed(run_id, f"the browser stopped unexpectedly: {str(exc)[:300]}")
            return
        finally:
            feed.stop()
        sink.close()
        keep = _settle(run_id, outcome, sandbox, proxy, previous=approval, fork=fork)
    finally:
        beat.stop()
        if not keep:
            destroy_sandbox(record)
        for conn in connections.all(initialized_only=True):
            conn.close()


def _live_feed(
    run_id: int,
    sandbox: Any,
    steps: list[dict[str, Any]],
    secrets_for_run: dict[str, dict[str, str]],
    run_settings: Any,
) -> Any:
    """The run's live view while this worker drives its browser (docs/live-view.md)."""

    return LiveFeed(
        run_id=run_id,
        cdp_url=sandbox.cdp_url,
        time_scale=float(sandbox.details.get("time_scale") or 1.0),
        secret_values=secret_values_of(secrets_for_run),
        secret_fields=secret_targets(steps),
        files_dir=run_files_dir(run_id),
        filmstrip=Filmstrip(
            seconds_per_frame=run_settings.filmstrip_seconds_per_frame,
            max_bytes=run_settings.filmstrip_max_mb * 1024 * 1024,
        )
        if run_settings.filmstrip
        else None,
    )


def _settle(
    run_id: int, outcome: Any, sandbox: Any, proxy: Any, *, previous: Any, fork: Fork | None
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
    if outcome.status == "answer_required":
        return _await_answer(run_id, outcome, sandbox, proxy)
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

    with transaction.atomic():
        run = lock_run(run_id)
        if run.is_final:
            return False
        run.outputs = outcome.outputs
        approval = approval_open(run=run, gate=outcome.gate, previous=previous)
        transition(run, S.AWAITING_APPROVAL, reason=outcome.reason)
    return _wait_for_people(run, approval.expires_at, sandbox, proxy)


def _await_answer(run_id: int, outcome: Any, sandbox: Any, proxy: Any) -> bool:

    with transaction.atomic():
        run = lock_run(run_id)
        if run.is_final:
            return False
        run.outputs = outcome.outputs
        question = question_open(run=run, question=outcome.question)
        transition(run, S.AWAITING_ANSWER, reason=outcome.reason)
    return _wait_for_people(run, question.expires_at, sandbox, proxy)


def _wait_for_people(run: Run, expires_at: datetime, sandbox: Any, proxy: Any) -> bool:
    """Keep the browser and its proxy until a person's decision or answer is due.

    The time waiting does not count against the run's own time limit, so the dead-man's switch
    moves past the request's expiry. The supervisor keeps the proxy up without this worker;
    whichever worker of the host continues the run finds it by its directory, and the host's
    housekeeping drains its spool.
    """

    remaining = max(0.0, run.deadline_at.timestamp() - time.time()) if run.deadline_at else 0.0
    waits_until = expires_at.timestamp() + remaining + 60
    try:
        sandbox_backend(sandbox.backend).extend(sandbox, waits_until)
    except SandboxError as exc:
        run_fail_waiting(run_id=run.pk, reason=f"the browser was lost while waiting: {exc}")
        return False
    proxy.extend(waits_until)
    return True


def run_fail_waiting(*, run_id: int, reason: str) -> None:
    """A waiting run that can no longer continue: its approval is voided, the run fails."""

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

    with transaction.atomic():
        run = lock_run(run_id)
        if run.is_final or run.status == S.NEEDS_RECONCILIATION:
            return
        open_action = ApprovalRequest.objects.filter(
            run=run, intent_at__isnull=False, completed_at__isnull=True, refused_at__isnull=True
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
    return credentials_open(names, team_id=run.team_id, run_id=run.pk)


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
            event_append(run, "egress_quiet", {"count": quiet})
        transition(run, status, reason=reason, sandbox=None, **fields)
