"""Launching, cancelling, reconciling and reaping runs, and destroying their sandboxes."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from pandaweb.audit.services import audit_record
from sessions.events import publish_queue_changed
from sessions.models import Run
from sessions.services.runstate import (
    RunError,
    S,
    TransitionRefused,
    _event,
    destroy_sandbox,
    lock_run,
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
    """Queue a run of the workflow's latest published version.

    The run goes to a worker at once when its workflow has a free slot (its concurrency limit);
    otherwise it waits in the workflow's queue, ``priority`` first, then oldest first.
    Idempotent per (user, key): launching again with the same key returns the same run.
    """
    if priority not in Run.Priority.values:
        raise RunError(
            "invalid priority", {"priority": ["Choose a priority: low, normal or high."]}
        )
    key = idempotency_key.strip()[:100]
    if key:
        existing = Run.objects.filter(launched_by=user, idempotency_key=key).first()
        if existing is not None:
            return _same_launch(existing, workflow_id)
    try:
        with transaction.atomic():
            return _launch(
                workflow_id=workflow_id, user=user, raw=raw_inputs, key=key, priority=priority
            )
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


def _launch(
    *, workflow_id: int, user: User, raw: Mapping[str, Any], key: str, priority: int
) -> Run:
    # NO KEY UPDATE: a settling run's transaction checks its rows' references to this workflow
    # at commit (deferred foreign keys), after it took the audit chain this launch waits for;
    # a FOR UPDATE here would make the two wait for each other.
    workflow = Workflow.objects.select_for_update(no_key=True).get(pk=workflow_id)
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
        priority=priority,
    )
    _event(run, "status", {"from": "", "to": S.QUEUED, "reason": ""})
    run.save(update_fields=["last_event_seq"])
    audit_record(
        action="run.launched",
        object_type="run",
        object_id=run.pk,
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
    candidates = Run.objects.filter(status__in=Run.ACTIVE - Run.WAITING_FOR_PEOPLE).filter(
        heartbeat_at__lt=cutoff
    )
    for run_id in candidates.values_list("pk", flat=True):
        with transaction.atomic():
            run = lock_run(run_id)
            if run.is_final or run.heartbeat_at is None or run.heartbeat_at >= cutoff:
                continue
            sandbox = run.sandbox
            if run.approvals.filter(
                intent_at__isnull=False, completed_at__isnull=True, refused_at__isnull=True
            ).exists():
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
    A decision like an approval: never by the person who launched the run (they could settle
    their own uncertain payment as "did not happen"), always with what was checked, audited.
    """
    from approvals.models import ApprovalRequest

    note = note.strip()
    if not note:
        raise RunError("say what you checked", {"note": ["This field is required."]})
    with transaction.atomic():
        run = lock_run(run_id)
        if run.status != S.NEEDS_RECONCILIATION:
            raise TransitionRefused("this run does not need reconciliation")
        if run.launched_by_id == user.pk:
            raise RunError(
                "you launched this run: someone else checks the portal and says whether the "
                "action happened"
            )
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
