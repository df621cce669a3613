"""Writes of the operations console: re-runs (same inputs, or continue from a step) and saved
views of the runs list. A re-run is a launch: the same checks, event, audit row and dispatch as
``services.run_launch``, plus the link to the run it repeats."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Q

from pandaweb.audit.services import audit_record
from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability
from sessions.models import Run, RunEvent, RunSeen, SavedRunView
from sessions.services import (
    IDEMPOTENCY_KEY_MAX_LENGTH,
    RunError,
    coerce_inputs,
    run_enqueue,
    run_replayed,
)
from sessions.services.records import event_append
from workflows.models import Workflow, WorkflowVersion

S = Run.Status


@dataclass(frozen=True)
class ContinueCheck:
    """Whether a run may be continued from ``index``, and if not, the reason people read."""

    index: int
    allowed: bool
    reason: str


def _irreversible_indexes(version: WorkflowVersion) -> dict[int, str]:
    steps = (version.document or {}).get("steps", [])
    return {i: str(s.get("id", "")) for i, s in enumerate(steps) if s.get("irreversible")}


def run_continue_checks(run: Run) -> list[ContinueCheck]:
    """For each step of a failed run's version: may a new run start there?

    Starting at N skips steps 0..N-1. That is refused when one of them is irreversible and its
    action may have reached the portal (an approval was granted or its intent recorded) and the
    run was not reconciled since: a second run would otherwise repeat the payment.
    """
    steps = (run.version.document or {}).get("steps", [])
    if run.status != S.FAILED:
        return []
    irreversible = _irreversible_indexes(run.version)
    acted = set(
        run.approvals.filter(Q(intent_at__isnull=False) | Q(status="approved")).values_list(
            "step_index", flat=True
        )
    )
    reconciled = RunEvent.objects.filter(
        run=run, type="status", payload__from=S.NEEDS_RECONCILIATION
    ).exists()
    checks = []
    for index in range(1, len(steps)):
        blocking = [i for i in irreversible if i < index and i in acted and not reconciled]
        if blocking:
            first = blocking[0]
            reason = (
                f"step {first + 1} ({irreversible[first]}) is irreversible and was approved "
                "in this run; reconcile the run first (say whether the action happened)"
            )
            checks.append(ContinueCheck(index=index, allowed=False, reason=reason))
        else:
            checks.append(ContinueCheck(index=index, allowed=True, reason=""))
    return checks


def run_rerun(
    *,
    run_id: int,
    user: User,
    raw_inputs: Mapping[str, Any],
    version: Literal["same", "latest"] = "same",
    start_index: int = 0,
    idempotency_key: str = "",
    priority: int | None = None,
) -> tuple[Run, bool]:
    """Launch a new run linked to ``run_id`` (``rerun_of``): the same or the latest published
    version, with ``raw_inputs`` checked like any launch; return it and whether this call made
    it. With ``start_index`` > 0 the new run continues a failed run from that step, starting
    with the original run's outputs; refused where ``run_continue_checks`` says so.

    ``priority`` (default: the original's) places it in its workflow's queue like a launch.
    Idempotent per (user, key) by the launch's rule (``run_replayed``): the same key for the same
    re-run answers with the run it made, for anything else raises ``IdempotencyKeyReused``.
    """
    key = idempotency_key.strip()
    if len(key) > IDEMPOTENCY_KEY_MAX_LENGTH:
        raise RunError(
            "invalid idempotency key",
            {"idempotency_key": [f"Use at most {IDEMPOTENCY_KEY_MAX_LENGTH} characters."]},
        )
    if key:
        existing = Run.objects.filter(launched_by=user, idempotency_key=key).first()
        if existing is not None:
            return _replayed(existing, run_id, raw_inputs, key, start_index), False
    try:
        with transaction.atomic():
            run = _rerun(run_id, user, raw_inputs, version, start_index, key, priority)
            return run, True
    except IntegrityError:
        existing = Run.objects.filter(launched_by=user, idempotency_key=key).first()
        if existing is None:
            raise
        return _replayed(existing, run_id, raw_inputs, key, start_index), False


def _replayed(
    existing: Run, run_id: int, raw: Mapping[str, Any], key: str, start_index: int
) -> Run:
    original = Run.objects.only("workflow_id").get(pk=run_id)
    return run_replayed(
        existing,
        key=key,
        workflow_id=original.workflow_id,
        raw=raw,
        rerun_of=run_id,
        start_index=start_index,
    )


def _rerun(
    run_id: int,
    user: User,
    raw: Mapping[str, Any],
    which: str,
    start_index: int,
    key: str,
    priority: int | None,
) -> Run:
    original = Run.objects.select_related("version").get(pk=run_id)
    workflow = Workflow.objects.select_for_update(no_key=True).get(pk=original.workflow_id)
    if workflow.archived:
        raise RunError("this workflow is archived")
    # Like a launch (run_launch): the new run is its workflow's team's, and so was the original.
    for team_id in {original.team_id, workflow.team_id}:
        if not user_can(user, Capability.LAUNCH_RUNS, team_id=team_id):
            raise RunError("you may not launch runs of another team's workflows")
    if which == "latest" and start_index == 0:
        version = (
            workflow.versions.filter(status=WorkflowVersion.Status.PUBLISHED)
            .order_by("-number")
            .first()
        )
        if version is None:
            raise RunError("this workflow has no published version")
    else:
        # Continuing runs the original's steps: the step numbers mean the same only there.
        version = original.version
    outputs: dict[str, Any] = {}
    if start_index:
        checks = {c.index: c for c in run_continue_checks(original)}
        check = checks.get(start_index)
        if check is None:
            raise RunError("only a failed run can be continued, from one of its steps")
        if not check.allowed:
            raise RunError(f"cannot continue from step {start_index + 1}: {check.reason}")
        outputs = dict(original.outputs)
    inputs = coerce_inputs(version, raw)
    run = Run.objects.create(
        workflow=workflow,
        team_id=workflow.team_id,
        version=version,
        inputs=inputs,
        outputs=outputs,
        idempotency_key=key,
        launched_by=user,
        sandbox_backend=original.sandbox_backend,
        rerun_of=original,
        start_index=start_index,
        priority=original.priority if priority is None else priority,
    )
    event_append(run, "status", {"from": "", "to": S.QUEUED, "reason": ""})
    run.save(update_fields=["last_event_seq"])
    queued = run_enqueue(run)
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
            "rerun_of": original.pk,
            "start_index": start_index,
            **queued,
        },
        run_id=run.pk,
    )
    return run


# Saved views ----------------------------------------------------------------------------------


def saved_view_save(*, user: User, name: str, query: str) -> SavedRunView:
    """Save (or replace) the person's view called ``name``. Idempotent."""
    name = name.strip()[:80]
    if not name:
        raise ValueError("a saved view needs a name")
    view, _ = SavedRunView.objects.update_or_create(
        user=user, name=name, defaults={"query": query[:1000]}
    )
    return view


def saved_view_delete(*, user: User, view_id: int) -> bool:
    """Delete one of the person's own views; another person's is left alone (False)."""
    deleted, _ = SavedRunView.objects.filter(user=user, pk=view_id).delete()
    return bool(deleted)


def run_mark_seen(*, run: Run, user: User) -> bool:
    """Note that ``user`` has seen how ``run`` ended; whether this is the first time.
    Idempotent.

    Not audited: the mark is this person's own reading state (like a read flag on a message). It
    changes nothing anyone else sees or relies on, not the run, its approvals or its evidence.
    """
    _, created = RunSeen.objects.get_or_create(run=run, user=user)
    return created
