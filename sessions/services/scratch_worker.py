"""Scratch sessions: the worker's side (start the browser, do one piece of work).

Only tasks import this module (it loads the browser driver). The web side is
``sessions.services.scratch``.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import transaction
from django.utils import timezone

from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record
from sessions.engine import recording
from sessions.engine.driver import ConnectionLost, HeldConnection, connect_timeout_ms
from sessions.engine.picking import PickFailed
from sessions.engine.pictures import picture_size
from sessions.engine.plan import RunPlan
from sessions.engine.runner import Runner
from sessions.engine.sandbox.base import Sandbox, SandboxError, SandboxSpec
from sessions.engine.sandbox.egress import EgressError, read_spool
from sessions.engine.steps.base import StepRecord
from sessions.engine.steps.language import Target
from sessions.models import ScratchSession
from sessions.services.credentials import credentials_open
from sessions.services.egress import egress_dir, egress_start
from sessions.services.runstate import destroy_sandbox, installation_tag
from sessions.services.sandboxes import sandbox_backend
from sessions.services.scratch import WORK_LIMIT, scratch_files_dir, scratch_steps
from workflows import services as workflow_services
from workflows.schema import credentials_used

if TYPE_CHECKING:
    from playwright.sync_api import Browser

logger = logging.getLogger(__name__)
S = ScratchSession.Status
T = TypeVar("T")
# This process's open connections to scratch sessions' browsers, by sandbox (run key): each
# piece of work of a session would otherwise connect anew (and make the browser restyle the page).
_held_connections: dict[str, HeldConnection] = {}
_held_lock = threading.Lock()
NEVER_IRREVERSIBLE = "a scratch session never does an irreversible step"
# Work stops this long before the housekeeping would take it for lost.
WORK_MARGIN = timedelta(seconds=15)


def scratch_start(*, scratch_id: int) -> None:
    """Start the session's browser behind the workflow's allowlist (the body of its task)."""
    with transaction.atomic():
        session = (
            ScratchSession.objects.select_for_update().select_related("workflow").get(pk=scratch_id)
        )
        if session.status != S.STARTING:
            return
        run_key = f"scratch-{scratch_id}-{installation_tag()}{secrets.token_hex(4)}"
        pending = {
            "pending": True, "run_key": run_key, "host": socket.gethostname(),
            "backend": session.backend, "egress_dir": str(egress_dir(run_key)),
        }  # fmt: skip
        session.sandbox = pending
        session.save(update_fields=["sandbox"])
    started = time.monotonic()
    # The watchdog beside the browser destroys it at this time whatever happens here.
    deadline = session.expires_at.timestamp() + 30
    try:
        proxy = egress_start(
            run_key=run_key, allowed_hosts=list(session.workflow.allowed_hosts), deadline=deadline
        )
        sandbox = sandbox_backend(session.backend).create(
            SandboxSpec(run_key=run_key, proxy_url=proxy.url, ttl_seconds=deadline - time.time())
        )
        proxy.link(sandbox.workdir)
    except (SandboxError, EgressError, OSError) as exc:
        destroy_sandbox(pending)
        _failed(scratch_id, f"the browser did not start: {exc}")
        return
    record = {
        **sandbox.to_dict(), "egress_dir": str(proxy.directory),
        "allowed_hosts": list(session.workflow.allowed_hosts),
    }  # fmt: skip
    with transaction.atomic():
        session = ScratchSession.objects.select_for_update().get(pk=scratch_id)
        if session.status != S.STARTING:
            keep = False
        else:
            keep = True
            session.sandbox = record
            session.status = S.READY
            session.seq += 1
            session.save(update_fields=["sandbox", "status", "seq"])
            audit_record(
                action="scratch.started",
                object_type="scratch_session",
                object_id=scratch_id,
                team_id=session.workflow.team_id,
                actor_kind=AuditEvent.ActorKind.RUNNER,
                after={"seconds": round(time.monotonic() - started, 2), "host": record["host"]},
            )
    if not keep:  # closed while it started
        destroy_sandbox(record)


def scratch_act(
    *,
    scratch_id: int,
    action: str,
    index: int | None,
    steps: list[dict[str, Any]],
    inputs: dict[str, Any],
    element: dict[str, Any] | None,
    skip: dict[str, str],
    work: str,
) -> None:
    """Do one piece of work the author asked for (``scratch.scratch_ask``; ``work`` names it)
    and record what came of it (the body of its task)."""
    session = (
        ScratchSession.objects.select_related("workflow").defer("observation").get(pk=scratch_id)
    )
    if not _still_asked(session, work) or not session.sandbox:
        return
    assert session.busy_since is not None
    sandbox = Sandbox.from_dict(session.sandbox)
    files = scratch_files_dir(scratch_id)
    # Done before the housekeeping would take it for lost, and before the session ends.
    deadline = min(session.expires_at, session.busy_since + WORK_LIMIT - WORK_MARGIN).timestamp()
    # Masks every picture and observation with the values of every credential the draft
    # types: an earlier step may have typed one into a field that is not a password field.
    secrets_for = _secrets(session, steps)
    # A step marked irreversible since the work was asked is not done either.
    marked_since = {
        str(step.get("id")): "it is marked irreversible now"
        for step in scratch_steps(session.workflow)
        if step.get("irreversible")
    }
    records: list[StepRecord] = []
    picked: dict[str, Any] | None = None
    note = ""
    try:
        if action in ("run_to", "try"):
            assert index is not None
            start, stop = (0, index + 1) if action == "run_to" else (index, index + 1)
            plan = replace(
                _plan(steps, inputs, secrets_for, files, sandbox, deadline),
                start_index=start, stop_index=stop, rehearsal=True,
                skip={**skip, **marked_since},
            )  # fmt: skip
            records = _rehearse(plan, sandbox, start_over=start == 0)
            if not records or not records[-1].screenshot:
                records.append(_look(sandbox, _plan([], {}, secrets_for, files, sandbox, deadline)))
        elif action == "look":
            records = [_look(sandbox, _plan([], {}, secrets_for, files, sandbox, deadline))]
        else:
            assert element is not None
            plan = _plan([], {}, secrets_for, files, sandbox, deadline)
            picked = _pick(sandbox, element, plan)
    except Exception as exc:  # the browser died, or Playwright lost it
        logger.exception("scratch session %s: %s failed", scratch_id, action)
        note = f"the browser did not answer: {str(exc).splitlines()[0][:300]}"
    _record(scratch_id, records, picked, note, steps, work)


def _still_asked(session: ScratchSession, work: str) -> bool:
    """Whether ``work`` is the piece of work the session waits for (not one the housekeeping
    took for lost, whose session moved on)."""
    return (
        session.status == S.BUSY
        and session.busy_since is not None
        and session.busy_since.isoformat() == work
    )


def _secrets(session: ScratchSession, steps: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    allowed = {str(name) for name in session.workflow.credentials.values_list("name", flat=True)}
    names = sorted(allowed & credentials_used(steps))
    if not names:
        return {}
    with transaction.atomic():
        return credentials_open(
            names, team_id=session.workflow.team_id, run_id=None, scratch_id=session.pk
        )


def _plan(
    steps: list[dict[str, Any]],
    inputs: dict[str, Any],
    secrets_for: dict[str, dict[str, str]],
    files: Path,
    sandbox: Sandbox,
    deadline: float,
) -> RunPlan:
    return RunPlan(
        steps=steps,
        inputs=inputs,
        secrets=secrets_for,
        step_budget=len(steps) + 1,
        deadline=deadline,
        artifacts_dir=files / "artifacts",
        time_scale=float(sandbox.details.get("time_scale") or 1.0),
    )


class _Collected:
    """The runner's sink in a scratch session: the records, kept for the end of the work.
    Never asked for an irreversible action's intent: a rehearsal skips those steps."""

    def __init__(self, expires_at: float) -> None:
        self.records: list[StepRecord] = []
        self.expires_at = expires_at

    def step_finished(self, record: StepRecord) -> None:
        self.records.append(record)

    def action_starting(self, index: int) -> None:
        raise RuntimeError(NEVER_IRREVERSIBLE)

    def action_finished(self, index: int, result: str = "") -> None:
        raise RuntimeError(NEVER_IRREVERSIBLE)

    def action_refused(self, index: int, reason: str) -> None:
        raise RuntimeError(NEVER_IRREVERSIBLE)

    def stop_reason(self) -> str | None:
        return "the scratch session's time ran out" if time.time() >= self.expires_at else None


def _rehearse(plan: RunPlan, sandbox: Sandbox, *, start_over: bool) -> list[StepRecord]:
    sink = _Collected(plan.deadline)
    runner = Runner(plan, sink)
    _held(sandbox, lambda browser: runner.run_with(browser, start_over=start_over))
    return sink.records


def _held(sandbox: Sandbox, work: Callable[[Browser], T], *, again: bool = True) -> T:
    """Do ``work`` on this process's open connection to the sandbox's browser (opened now if
    there is none, or if it closed: idle, or its browser gone; once)."""
    live = {
        str((record or {}).get("run_key"))
        for record in ScratchSession.objects.filter(status__in=ScratchSession.OPEN).values_list(
            "sandbox", flat=True
        )
    }
    with _held_lock:
        # A connection holds a driver's thread: those of ended sessions give theirs back now
        # (the next connection then finds a warm driver), not when they have been idle a while.
        ended = [
            _held_connections.pop(key)
            for key in [
                k for k, held in _held_connections.items() if not held.open or k not in live
            ]
        ]
        held = _held_connections.get(sandbox.run_key)
        if held is None:
            held = _held_connections[sandbox.run_key] = HeldConnection(
                sandbox.cdp_url,
                artifacts_dir=sandbox.details.get("artifacts_dir"),
                timeout_ms=connect_timeout_ms(float(sandbox.details.get("time_scale") or 1.0)),
            )
    for connection in ended:
        connection.close(wait=True)
    try:
        return held.run(work)
    except ConnectionLost:
        with _held_lock:
            if _held_connections.get(sandbox.run_key) is held:
                del _held_connections[sandbox.run_key]
        if not again:
            raise
        return _held(sandbox, work, again=False)


def _look(sandbox: Sandbox, plan: RunPlan) -> StepRecord:
    return _held(sandbox, Runner(plan, _Collected(plan.deadline)).look)


def _pick(sandbox: Sandbox, element: dict[str, Any], plan: RunPlan) -> dict[str, Any]:
    runner = Runner(plan, _Collected(plan.deadline))
    clock = time.monotonic()
    try:
        picked = _held(sandbox, lambda browser: runner.pick(browser, element))
    except PickFailed as exc:
        return {"element": element, "proposals": [], "error": str(exc)}
    proposals = picked.proposals
    return {
        "element": element,
        "secret": picked.secret,
        "ms": round((time.monotonic() - clock) * 1000),
        "proposals": [
            {
                "target": p.target.model_dump(exclude_defaults=True),
                "described": p.target.describe(),
                "compact": p.target.to_compact(),
                "kind": p.kind,
                "matches": p.matches,
                "words": p.words,
            }
            for p in proposals
        ],
        "error": "" if proposals else "no target finds this element: write one by hand",
    }


def _record(
    scratch_id: int,
    records: list[StepRecord],
    picked: dict[str, Any] | None,
    note: str,
    steps: list[dict[str, Any]],
    work: str,
) -> None:
    with transaction.atomic():
        # The page's observation (a megabyte on a 1,000-row table) is read and written only
        # when this work saw the page anew.
        found = ScratchSession.objects.select_for_update()
        session = (found if records else found.defer("observation")).get(pk=scratch_id)
        if not _still_asked(session, work):
            # Closed, expired or taken for lost meanwhile: what it did is not the session's.
            return
        files = scratch_files_dir(scratch_id)
        files.mkdir(parents=True, exist_ok=True)
        session.seq += 1
        results = dict(session.results)
        steps_by_id = {str(step.get("id")): step for step in steps}
        results_note: dict[str, str] = {}
        upcoming = (session.observation or {}).get("upcoming")
        done = [r for r in records if r.step_id and r.status != "skipped"]
        if done:
            # The step that acts next on the page: the one that failed on it, or the next.
            upcoming = done[-1].index + (0 if done[-1].status == "failed" else 1)
        before, where = _dialogs(session.observation), session.url
        for record in records:
            recording.finish(record)
            after = _dialogs(record.observation) if record.screenshot else before
            # Only a click that stayed on its page and showed a dialog it had not: one that
            # went on to another page (which may greet with a dialog of its own) did more.
            if record.step_type == "click" and record.status == "succeeded" and record.url == where:
                opened = after - before
                if opened:
                    _learn_dialog(session, steps_by_id.get(record.step_id), sorted(opened)[0])
                    results_note[record.step_id] = f"it opened the dialog '{sorted(opened)[0]}'"
            before, where = after, record.url or where
            picture = ""
            if record.screenshot:
                picture = f"{session.seq}-{record.index + 1}.jpg"
                (files / picture).write_bytes(record.screenshot)
                session.picture, session.url = picture, record.url
                width, height = picture_size(record.screenshot)
                session.observation = {
                    "elements": (record.observation or {}).get("elements") or [],
                    "width": width,
                    "height": height,
                    "upcoming": upcoming,
                }
                session.picked = None
            if record.step_id:
                results[record.step_id] = {
                    "status": record.status,
                    "sentence": record.sentence,
                    "error": record.error,
                    "picture": picture,
                    "url": record.url,
                    "ms": record.duration_ms,
                    "at": datetime.now(UTC).isoformat(),
                    "outputs": sorted(record.outputs),
                    "learned": results_note.get(record.step_id, ""),
                }
        if picked is not None:
            session.picked = picked
        session.results = results
        session.refused = _refusals(session)
        session.status = S.READY
        session.doing = ""
        session.busy_since = None
        session.reason = note
        changed = ["seq", "results", "picked", "refused", "status", "doing", "busy_since", "reason"]
        session.save(
            update_fields=[*changed, "picture", "url", "observation"] if records else changed
        )
        audit_record(
            action="scratch.done",
            object_type="scratch_session",
            object_id=scratch_id,
            team_id=session.workflow.team_id,
            actor_kind=AuditEvent.ActorKind.RUNNER,
            after={
                "steps": {r.step_id: r.status for r in records if r.step_id},
                "proposals": len((picked or {}).get("proposals") or []),
                **({"note": note} if note else {}),
            },
        )


def _dialogs(observation: dict[str, Any] | None) -> set[str]:
    return {
        " ".join(str(e.get("name") or "").split()) or "untitled"
        for e in (observation or {}).get("elements") or []
        if e.get("role") in ("dialog", "alertdialog")
    }


def _learn_dialog(session: ScratchSession, step: dict[str, Any] | None, dialog: str) -> None:
    """A click that only opened a dialog is not the final action its words may suggest: the
    workflow learns it (for the step's target as it is), so publishing stops warning."""
    if step is None or step.get("irreversible") or not isinstance(step.get("target"), dict):
        return
    target = Target.model_validate(step["target"]).model_dump(exclude_defaults=True)
    workflow_services.workflow_learn_dialog(
        workflow_id=session.workflow_id,
        user=session.started_by,
        step_id=str(step["id"]),
        target=target,
        dialog=dialog,
        seen=f"scratch session #{session.pk}",
    )


def _refusals(session: ScratchSession) -> dict[str, int]:
    """The hosts the proxy refused so far, with how often (each refusal once in the trail)."""
    directory = (session.sandbox or {}).get("egress_dir")
    if not directory:
        return dict(session.refused)
    refused = dict(session.refused)
    seen = sum(refused.values())
    for line in read_spool(Path(directory), after=seen):
        host = str(line.get("host") or "?")
        refused[host] = refused.get(host, 0) + 1
        audit_record(
            action="scratch.egress_denied",
            object_type="scratch_session",
            object_id=session.pk,
            team_id=session.workflow.team_id,
            actor_kind=AuditEvent.ActorKind.RUNNER,
            after={key: line.get(key) for key in ("host", "port", "method", "reason")},
        )
    return refused


def _failed(scratch_id: int, reason: str) -> None:
    with transaction.atomic():
        session = ScratchSession.objects.select_for_update().get(pk=scratch_id)
        if not session.is_open:
            return
        session.status = S.FAILED
        session.reason = reason
        session.sandbox = None
        session.ended_at = timezone.now()
        session.seq += 1
        session.save(update_fields=["status", "reason", "sandbox", "ended_at", "seq"])
        audit_record(
            action="scratch.failed",
            object_type="scratch_session",
            object_id=scratch_id,
            team_id=session.workflow.team_id,
            actor_kind=AuditEvent.ActorKind.RUNNER,
            after={"reason": reason},
        )
