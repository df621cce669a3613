"""Launching, cancelling, reconciling and reaping runs, and destroying their sandboxes."""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest
from approvals.services import approval_void_pending
from pandaweb.audit.services import audit_record
from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability
from sessions.engine.sandbox.local import reap_orphans
from sessions.events import publish_queue_changed
from sessions.models import Run, StepResult
from sessions.services.egress import egress_dir, egress_root
from sessions.services.records import event_append, lock_run
from sessions.services.runstate import (
    IDEMPOTENCY_KEY_MAX_LENGTH,
    IdempotencyKeyReused,
    RunError,
    S,
    TransitionRefused,
    destroy_sandbox,
    installation_tag,
    queue_position,
    queue_release,
    transition,
)
from workflows.models import Workflow, WorkflowVersion
from workflows.schema import Parameter

logger = logging.getLogger(__name__)

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


def parse_priority(value: Any) -> int:
    """A launch's priority from a form or a request: ``low``, ``normal`` or ``high`` (or their
    numbers 0-2); blank means normal."""
    if value is None or value == "":
        return Run.Priority.NORMAL
    if isinstance(value, int) and not isinstance(value, bool) and value in Run.Priority.values:
        return value
    names = {label.lower(): number for number, label in Run.Priority.choices}
    text = str(value).strip().lower()
    if text in names:
        return names[text]
    if text.isdigit() and int(text) in Run.Priority.values:
        return int(text)
    raise RunError("invalid priority", {"priority": ["Choose a priority: low, normal or high."]})


def run_launch(
    *,
    workflow_id: int,
    user: User,
    raw_inputs: Mapping[str, Any],
    idempotency_key: str = "",
    priority: int = Run.Priority.NORMAL,
) -> Run:
    """Queue a run of the workflow's latest published version (``run_launch_once`` without
    saying whether this call made it)."""
    run, _ = run_launch_once(
        workflow_id=workflow_id,
        user=user,
        raw_inputs=raw_inputs,
        idempotency_key=idempotency_key,
        priority=priority,
    )
    return run


def run_launch_once(
    *,
    workflow_id: int,
    user: User,
    raw_inputs: Mapping[str, Any],
    idempotency_key: str = "",
    priority: int = Run.Priority.NORMAL,
) -> tuple[Run, bool]:
    """Queue a run of the workflow's latest published version; return it and whether this call
    made it.

    The run goes to a worker at once when its workflow has a free slot (its concurrency limit);
    otherwise it waits in the workflow's queue, ``priority`` first, then oldest first.

    The one launch rule of every way in (form, API, CLI, MCP, schedules, batches): with an
    ``idempotency_key`` the same (user, key) with the same workflow and inputs returns the run
    launched first, and the same key with anything else raises ``IdempotencyKeyReused``
    rather than launch, or answer with, a run nobody asked for.
    """
    if priority not in Run.Priority.values:
        raise RunError(
            "invalid priority", {"priority": ["Choose a priority: low, normal or high."]}
        )
    key = idempotency_key.strip()
    if len(key) > IDEMPOTENCY_KEY_MAX_LENGTH:
        raise RunError(
            "invalid idempotency key",
            {"idempotency_key": [f"Use at most {IDEMPOTENCY_KEY_MAX_LENGTH} characters."]},
        )
    if key:
        existing = Run.objects.filter(launched_by=user, idempotency_key=key).first()
        if existing is not None:
            return run_replayed(existing, key=key, workflow_id=workflow_id, raw=raw_inputs), False
    try:
        with transaction.atomic():
            run = _launch(
                workflow_id=workflow_id, user=user, raw=raw_inputs, key=key, priority=priority
            )
            return run, True
    except IntegrityError:
        # Two launches with one key raced; the other one won and its run is the answer.
        existing = Run.objects.filter(launched_by=user, idempotency_key=key).first()
        if existing is None:
            raise
        return run_replayed(existing, key=key, workflow_id=workflow_id, raw=raw_inputs), False


def run_replayed(
    run: Run,
    *,
    key: str,
    workflow_id: int,
    raw: Mapping[str, Any],
    rerun_of: int | None = None,
    start_index: int = 0,
) -> Run:
    """``run``, found by its launcher's idempotency ``key``, when it is the launch asked for
    again: the same workflow, inputs and (for a re-run) original run and first step. A key
    reused for anything else raises ``IdempotencyKeyReused``: answering with another run would
    hand back a run nobody asked for."""
    if (
        run.workflow_id != workflow_id
        or run.rerun_of_id != rerun_of
        or run.start_index != start_index
        or not _same_inputs(run, raw)
    ):
        raise IdempotencyKeyReused(
            f"the idempotency key {key!r} was already used for a different launch (run {run.pk})"
        )
    return run


def _same_inputs(run: Run, raw: Mapping[str, Any]) -> bool:
    try:
        return coerce_inputs(run.version, raw) == run.inputs
    except RunError:
        return False


def _launch(
    *, workflow_id: int, user: User, raw: Mapping[str, Any], key: str, priority: int
) -> Run:
    # NO KEY UPDATE: a settling run's transaction checks its rows' references to this workflow
    # at commit (deferred foreign keys), after it took the audit chain this launch waits for;
    # a FOR UPDATE here would make the two wait for each other.
    workflow = Workflow.objects.select_for_update(no_key=True).get(pk=workflow_id)
    if workflow.archived:
        raise RunError("this workflow is archived")
    # Every way in (page, API, schedule, batch, MCP) launches through here: the team rule too.
    if not user_can(user, Capability.LAUNCH_RUNS, team_id=workflow.team_id):
        raise RunError(f"you may not launch runs of {workflow.team}'s workflows")
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
        team_id=workflow.team_id,
        version=version,
        inputs=inputs,
        idempotency_key=key,
        launched_by=user,
        sandbox_backend=settings.SANDBOX_BACKEND,
        priority=priority,
    )
    event_append(run, "status", {"from": "", "to": S.QUEUED, "reason": ""})
    run.save(update_fields=["last_event_seq"])
    audit_record(
        action="run.launched",
        object_type="run",
        object_id=run.pk,
        team_id=run.team_id,
        actor=user,
        after={
            "workflow": workflow.slug,
            "version": version.number,
            "inputs": inputs,
            **run_enqueue(run),
        },
        run_id=run.pk,
    )
    return run


def run_enqueue(run: Run) -> dict[str, Any]:
    """A new run (in its launch's transaction, its workflow locked) joins its workflow's queue:
    it goes to a worker now if a slot is free and nobody waits ahead of it, else it waits.
    Returns what its launch's audit row records of that."""
    released = queue_release(workflow_id=run.workflow_id, launching=run.pk)
    run.refresh_from_db(fields=["dispatched_at", "last_event_seq"])
    facts = {"priority": run.get_priority_display().lower()}
    if run.pk in released:
        return {**facts, "queue": "dispatched"}
    publish_queue_changed(run.workflow_id)
    return {**facts, "queue": "waiting", "ahead": queue_position(run)}


# Cancel and reap --------------------------------------------------------------------------------


def run_cancel(*, run_id: int, user: User) -> Run:
    """Stop a run: queued runs never start; active runs lose their sandbox at once.

    Idempotent: cancelling a finished run changes nothing.
    """

    with transaction.atomic():
        run = lock_run(run_id)
        if not user_can(user, Capability.LAUNCH_RUNS, team_id=run.team_id):
            raise RunError("you may not cancel another team's runs")
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
    """Settle active runs whose worker went quiet, from what was recorded, and destroy their
    sandboxes.

    A run is never re-run automatically: it may have been half way through a payment. What the
    record shows decides: an approved action started and never finished needs reconciliation;
    every step recorded as done is a success; an approved action that went through, with steps
    after it missing, is interrupted in words that say the action happened; anything else is
    interrupted.
    """
    if stale_after is None:
        stale_after = timedelta(seconds=settings.RUN_HEARTBEAT_TIMEOUT_SECONDS)
    cutoff = timezone.now() - stale_after
    reaped = []
    candidates = Run.objects.filter(status__in=Run.ACTIVE - Run.WAITING_FOR_PEOPLE).filter(
        heartbeat_at__lt=cutoff
    )
    for run_id in candidates.values_list("pk", flat=True):
        with transaction.atomic():
            run = lock_run(run_id)
            if run.is_final or run.heartbeat_at is None or run.heartbeat_at >= cutoff:
                continue
            sandbox = run.sandbox
            status, reason, evidence = _settled_from_record(run)
            transition(
                run, status, sandbox=None, reason=reason,
                audit_extra={"settled_by": "reaper", **evidence},
            )  # fmt: skip
        if sandbox:
            destroy_sandbox(sandbox)
        reaped.append(run_id)
    return reaped


def _settled_from_record(run: Run) -> tuple[str, str, dict[str, Any]]:
    """How a run whose worker stopped ends, from its recorded steps and gated actions."""
    approvals = run.approvals.filter(refused_at__isnull=True)
    uncertain = approvals.filter(intent_at__isnull=False, completed_at__isnull=True).first()
    if uncertain is not None:
        return (
            S.NEEDS_RECONCILIATION,
            "the worker stopped in the middle of an approved action, which may have happened; "
            "check the portal",
            {"approval": uncertain.pk},
        )
    step_count = len((run.version.document or {}).get("steps", []))
    done = set(
        run.step_results.filter(status=StepResult.Status.SUCCEEDED).values_list("index", flat=True)
    )
    if run.status == S.RUNNING and step_count and done >= set(range(run.start_index, step_count)):
        return S.SUCCEEDED, "", {"steps_recorded_done": len(done)}
    went_through = approvals.filter(completed_at__isnull=False).order_by("-completed_at").first()
    if went_through is not None:
        answer = (
            f"; the portal answered: {went_through.action_result}"
            if (went_through.action_result)
            else ""
        )
        return (
            S.INTERRUPTED,
            f"the approved action of step {went_through.step_index + 1} went through "
            f"({went_through.action}{answer}); the worker stopped before the steps after it "
            "ran, and they were not restarted",
            {"approval": went_through.pk, "action_completed": True},
        )
    return S.INTERRUPTED, "the worker running it stopped answering; it was not restarted", {}


def sandbox_reap_orphans(*, grace: timedelta = timedelta(seconds=30)) -> list[str]:
    """Destroy this host's sandboxes and egress supervisors that nothing should keep; return
    their run keys.

    Past their deadline (the watchdog next to each does this first; this covers a watchdog that
    was killed and a host that restarted mid-run), and, from what is on disk, any of this
    installation's that no live run owns: a run that ended, or that started its sandbox again
    under another key, while something of the old start survived. ``grace`` spares what is
    younger (a destroy already under way)."""

    return reap_orphans(settings.ENGINE_CONFIG.sandbox_dir) + _reap_unowned(grace)


def _reap_unowned(grace: timedelta) -> list[str]:
    own_key = re.compile(rf"run-(\d+)-{installation_tag()}[0-9a-f]{{8}}")
    root = settings.ENGINE_CONFIG.sandbox_dir.absolute()
    settled_before = time.time() - grace.total_seconds()
    found: dict[str, int] = {}
    for place in (root, egress_root()):
        with contextlib.suppress(FileNotFoundError):
            for entry in place.iterdir():
                matched = own_key.fullmatch(entry.name)
                with contextlib.suppress(FileNotFoundError):
                    if matched and entry.is_dir() and entry.stat().st_mtime < settled_before:
                        found[entry.name] = int(matched.group(1))
    if not found:
        return []
    runs = Run.objects.filter(pk__in=set(found.values())).only("status", "sandbox")
    live = {run.pk: run for run in runs}
    reaped = []
    for key, run_id in sorted(found.items()):
        run = live.get(run_id)
        if run is not None and not run.is_final and (run.sandbox or {}).get("run_key") == key:
            continue
        logger.warning("destroying %s: no live run owns it", key)
        destroy_sandbox({
            "pending": True, "run_id": run_id, "run_key": key, "host": socket.gethostname(),
            "backend": run.sandbox_backend if run is not None else "local",
            "egress_dir": str(egress_dir(key)),
        })  # fmt: skip
        reaped.append(key)
    return reaped


def reconcile_refusal(run: Run, *, user_id: int | None, may_decide: bool) -> str:
    """Why this person may not settle the run's uncertain action, in their words ("" if they may).

    Anyone who may decide approvals, except the run's launcher and the reviewers who approved
    that action: each of them could settle their own uncertain payment as "did not happen".
    """

    if not may_decide:
        return "only someone who may decide approvals can say whether the action happened"
    if user_id is not None and run.launched_by_id == user_id:
        return (
            "you launched this run: someone else checks the portal and says whether the "
            "action happened"
        )
    approved_it = ApprovalDecision.objects.filter(
        request__run=run,
        request__intent_at__isnull=False,
        request__completed_at__isnull=True,
        request__refused_at__isnull=True,
        reviewer_id=user_id,
        verdict=ApprovalDecision.Verdict.APPROVE,
    )
    if approved_it.exists():
        return (
            "you approved this action: someone else checks the portal and says whether it happened"
        )
    return ""


def run_reconcile(*, run_id: int, user: User, happened: bool, note: str) -> Run:
    """A person's word on an approved action whose end was never recorded.

    ``happened`` after checking the portal: the run ends succeeded when the action was its last
    step, failed otherwise (the rest is not run: the browser is gone); not happened: cancelled.
    A decision like an approval, taken by whom ``reconcile_refusal`` allows, always with what
    was checked, audited.
    """

    note = note.strip()
    if not note:
        raise RunError("say what you checked", {"note": ["This field is required."]})
    with transaction.atomic():
        run = lock_run(run_id)
        if run.status != S.NEEDS_RECONCILIATION:
            raise TransitionRefused("this run does not need reconciliation")
        refusal = reconcile_refusal(
            run,
            user_id=user.pk,
            may_decide=user_can(user, Capability.DECIDE_APPROVALS, team_id=run.team_id),
        )
        if refusal:
            raise RunError(refusal)
        approval = ApprovalRequest.objects.select_for_update().get(
            run=run, intent_at__isnull=False, completed_at__isnull=True, refused_at__isnull=True
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
