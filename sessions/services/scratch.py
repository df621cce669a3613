"""Scratch sessions: the web side (open, ask for work, close, expire, use a picked target).

A scratch session is a browser of the workflow's backend behind the workflow's allowlist where
an author tries the draft's steps and points at elements of the live page to write targets. The
browser lives in its sandbox's supervisor, as a waiting run's does; each piece of work (run up to
a step, try one step, look at the page, pick an element) is a task of a worker on the sandbox's
host (``sessions.services.scratch_worker``), one at a time. Nothing irreversible is ever done:
irreversible steps and questions to people are recorded as skipped. Every change is audited,
sessions are time-limited and counted against ``SCRATCH_SESSIONS_MAX``, and the browser is
destroyed on closing or expiry (its watchdog destroys it at the expiry even if nothing else
runs).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Collection
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from pandaweb.audit.services import audit_record
from pandaweb.core.dispatch import dispatch, task_named
from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability
from sessions.engine.healing import Candidate, absent_from, candidate_at, heal_candidates
from sessions.engine.steps.language import CREDENTIAL_FIELDS, Target
from sessions.models import ScratchSession
from sessions.services.runstate import destroy_sandbox, host_queue
from workflows import selectors as workflow_selectors
from workflows import services as workflow_services
from workflows.models import Workflow, WorkflowVersion
from workflows.schema import STEP_ADAPTER, irreversible_warnings

Action = Literal["run_to", "try", "look", "pick"]
S = ScratchSession.Status
# A browser not started after this long, or work not done after this long, was lost.
START_LIMIT = timedelta(minutes=3)
WORK_LIMIT = timedelta(minutes=5)


class ScratchError(Exception):
    """The scratch session cannot do that now; the message is for people."""


def scratch_files_dir(scratch_id: int) -> Path:
    return Path(settings.RUN_FILES_DIR) / "scratch" / str(scratch_id)


def scratch_steps(workflow: Workflow) -> list[dict[str, Any]]:
    """What a scratch session tries: the working copy's session steps (the login a session
    template would bake), then its run steps, as one list."""
    version = workflow_selectors.working_copy(workflow)
    if version is None:
        return []
    return [*((version.session or {}).get("steps") or []), *(version.steps or [])]


def scratch_credential_fields(workflow: Workflow) -> list[str]:
    """The workflow's credentials' fields a step may type, as ``credential.field``."""
    kinds = workflow.credentials.values_list("name", "kind")
    return [
        f"{name}.{field}"
        for name, kind in sorted(kinds)
        for field in CREDENTIAL_FIELDS.get(kind, ())
    ]


def scratch_inputs(workflow: Workflow) -> dict[str, Any]:
    """The parameters' defaults: a scratch session has no launch form (a step that needs a
    parameter without a default fails, saying which)."""
    version = workflow_selectors.working_copy(workflow)
    return {
        str(p["name"]): p["default"]
        for p in (version.parameters if version is not None else [])
        if p.get("default") is not None
    }


def scratch_open(*, workflow_id: int, user: User) -> ScratchSession:
    """Open a scratch session of the workflow for ``user``, or return the one they have open.
    Raises ScratchError when every scratch session the installation allows is in use, or when
    ``user`` does not author its team's workflows (a scratch session types its credentials)."""
    with transaction.atomic():
        workflow = Workflow.objects.select_for_update().get(pk=workflow_id)
        if not user_can(user, Capability.AUTHOR_WORKFLOWS, team_id=workflow.team_id):
            raise ScratchError(f"you may not change {workflow.team}'s workflows")
        now = timezone.now()
        mine = ScratchSession.objects.filter(
            workflow=workflow, started_by=user, status__in=ScratchSession.OPEN
        ).first()
        if mine is not None and mine.expires_at > now:
            return mine
        if workflow.archived:
            raise ScratchError("this workflow is archived")
        if not workflow.allowed_hosts:
            raise ScratchError(
                "the workflow allows no host yet: add its portal to the allowed hosts first"
            )
        # Expired ones count no more: the housekeeping destroys them within its round.
        open_now = ScratchSession.objects.filter(status__in=ScratchSession.OPEN, expires_at__gt=now)
        if open_now.count() >= settings.SCRATCH_SESSIONS_MAX:
            first = open_now.order_by("expires_at").first()
            until = timezone.localtime(first.expires_at).strftime("%H:%M") if first else "soon"
            raise ScratchError(
                f"all {settings.SCRATCH_SESSIONS_MAX} scratch sessions are in use; close one "
                f"or wait until one ends (the first at {until})"
            )
        session = ScratchSession.objects.create(
            workflow=workflow,
            started_by=user,
            backend=settings.SANDBOX_BACKEND,
            expires_at=now + timedelta(minutes=settings.SCRATCH_SESSION_MINUTES),
        )
        audit_record(
            action="scratch.opened",
            object_type="scratch_session",
            object_id=session.pk,
            team_id=session.workflow.team_id,
            actor=user,
            after={
                "workflow": workflow.slug,
                "allowed_hosts": list(workflow.allowed_hosts),
                "backend": session.backend,
                "expires_at": session.expires_at.isoformat(),
            },
        )
        dispatch(task_named("scratch.start"), scratch_id=session.pk)
    return session


def scratch_get(*, scratch_id: int, user: User) -> ScratchSession:
    """The scratch session, for the person who opened it (a browser is nobody else's to drive).
    Raises ScratchSession.DoesNotExist otherwise."""
    return ScratchSession.objects.select_related("workflow").get(pk=scratch_id, started_by=user)


def scratch_ask(
    *,
    scratch_id: int,
    user: User,
    action: Action,
    step_id: str = "",
    element: int | None = None,
    confirm: str = "",
) -> ScratchSession:
    """Queue one piece of work: ``run_to`` (the steps from the first up to ``step_id``, on a
    fresh page), ``try`` (only ``step_id``, on the page as it is), ``look`` (a new picture of
    the page), ``pick`` (targets for ``element`` of the last picture's observation). One at a
    time: asking while it works is refused in words (a double click queues nothing).

    Irreversible steps and questions are never done, and neither is a step that reads like a
    final action without being marked irreversible (``final_sounding``), unless it is the one
    step tried and ``confirm`` is its id: the author clicks it for real, on the record."""
    _end_if_changed(scratch_id, user)
    with transaction.atomic():
        session = _lock(scratch_id, user)
        _refuse_unless_ready(session)
        steps = scratch_steps(session.workflow)
        ids = [str(step.get("id", "")) for step in steps]
        if action in ("run_to", "try") and step_id not in ids:
            raise ScratchError(f"the draft has no step '{step_id}' any more: reload the page")
        index = ids.index(step_id) if step_id in ids else None
        picked: dict[str, Any] | None = None
        if action == "pick":
            picked = _element(session, element)
        doing = {
            "run_to": f"running steps 1 to {(index or 0) + 1}",
            "try": f"trying step {(index or 0) + 1} ('{step_id}')",
            "look": "looking at the page",
            "pick": f"finding targets for element [{element}]",
        }[action]
        skip = final_sounding(session.workflow, steps)
        confirmed = action == "try" and step_id in skip and confirm.strip() == step_id
        if confirmed:
            del skip[step_id]
        session.status = S.BUSY
        session.doing = doing
        session.busy_since = timezone.now()
        session.save(update_fields=["status", "doing", "busy_since"])
        audit_record(
            action="scratch.asked",
            object_type="scratch_session",
            object_id=session.pk,
            team_id=session.workflow.team_id,
            actor=user,
            after={
                "action": action, "step": step_id, "element": element, "doing": doing,
                **({"clicked_although_final_sounding": step_id} if confirmed else {}),
            },
        )  # fmt: skip
        host = str((session.sandbox or {}).get("host") or "")
        dispatch(
            task_named("scratch.act"),
            # The browser is on one machine: only its workers can reach it.
            queue=host_queue(host) if host else None,
            scratch_id=session.pk,
            action=action,
            index=index,
            steps=steps,
            inputs=scratch_inputs(session.workflow),
            element=picked,
            skip=skip,
            # Only this piece of work may record its results (a lost one freed meanwhile may not).
            work=session.busy_since.isoformat(),
        )
    return session


def final_sounding(workflow: Workflow, steps: list[dict[str, Any]]) -> dict[str, str]:
    """The steps not marked irreversible whose target reads like a final action ("Pay",
    "Delete"), and that were not seen to only open a dialog: step id → why a scratch session
    does not do them unasked (what publishing warns about, too)."""
    models = []
    for data in steps:
        try:
            models.append(STEP_ADAPTER.validate_python(data))
        except ValueError:
            continue
    learned = (workflow.page_facts or {}).get("opens_dialog")
    return {
        models[int(problem.path[1])].id: (
            "it reads like a final action and is not marked irreversible: try it alone and "
            "type its id to click it for real"
        )
        for problem in irreversible_warnings(models, learned)
    }


def _end_if_changed(scratch_id: int, user: User) -> None:
    """End a session whose workflow was archived, or whose allowed hosts changed, since it
    opened (its browser's proxy still has the old allowlist); raises ScratchError saying so."""
    session = (
        ScratchSession.objects.select_related("workflow")
        .defer("observation")
        .get(pk=scratch_id, started_by=user)
    )
    workflow = session.workflow
    opened_with = sorted((session.sandbox or {}).get("allowed_hosts") or [])
    if not session.is_open or not session.sandbox or session.status == S.STARTING:
        return
    if workflow.archived or opened_with != sorted(workflow.allowed_hosts):
        why = "the workflow was archived" if workflow.archived else "its allowed hosts changed"
        scratch_close(scratch_id=scratch_id, user=None, status=S.CLOSED, reason=why)
        raise ScratchError(f"{why} since this session opened: open a new one")


def _element(session: ScratchSession, number: int | None) -> dict[str, Any]:
    observation = (
        ScratchSession.objects.filter(pk=session.pk).values_list("observation", flat=True).get()
    )
    elements = (observation or {}).get("elements") or []
    element = next((e for e in elements if number is not None and e.get("number") == number), None)
    if element is None:
        raise ScratchError(f"the page has no element [{number}] now: look at the page again")
    return dict(element)


@dataclass(frozen=True)
class PageProposal:
    """A target of the step about to run that the page shows nothing for, and the page's
    elements that look like what it means (a login's submit button reads "Sign in" here)."""

    step_id: str
    field: str
    target: Target
    candidates: list[Candidate]


def scratch_page_proposals(session: ScratchSession) -> list[PageProposal]:
    """What the page as last seen says about the step that acts next on it (the step that
    failed on it, or the one after the last step done): each of its targets that names nothing
    on the page, with the elements like it."""
    observation = session.observation or {}
    elements = observation.get("elements") or []
    upcoming = observation.get("upcoming")
    steps = scratch_steps(session.workflow)
    if not elements or not isinstance(upcoming, int) or not 0 <= upcoming < len(steps):
        return []
    try:
        step = STEP_ADAPTER.validate_python(steps[upcoming])
    except ValueError:
        return []
    found = []
    for field in step.target_fields():
        target = getattr(step, field, None)
        if isinstance(target, Target) and absent_from(target, elements):
            alike = heal_candidates(target, elements, interactive_only=step.touches_page, limit=3)
            found.append(PageProposal(step.id, field, target, alike))
    return found


def scratch_use_element(
    *, scratch_id: int, user: User, step_id: str, field: str, number: int, confirm: str = ""
) -> WorkflowVersion:
    """Point the draft's step ``step_id`` (its ``field``) at element ``number`` of the page as
    last seen, proposed for it by ``scratch_page_proposals``. Raises ScratchError or
    ``workflow_services.WorkflowError`` in people's words."""
    session = scratch_get(scratch_id=scratch_id, user=user)
    proposal = next(
        (p for p in scratch_page_proposals(session) if (p.step_id, p.field) == (step_id, field)),
        None,
    )
    elements = (session.observation or {}).get("elements") or []
    chosen = (
        candidate_at(proposal.target, elements, number, "chosen on the page")
        if proposal is not None
        else None
    )
    if proposal is None or chosen is None:
        raise ScratchError("the page or the step changed: look at the page again")
    return workflow_services.step_target_set(
        workflow_id=session.workflow_id,
        user=user,
        step_id=step_id,
        field=field,
        target=chosen.target.model_dump(exclude_defaults=True),
        expected=proposal.target.model_dump(exclude_defaults=True),
        confirm=confirm,
        extra={"scratch_session": session.pk, "element": number},
    )


def scratch_use_target(
    *,
    scratch_id: int,
    user: User,
    step_id: str,
    field: str,
    proposal: int,
    confirm: str = "",
) -> WorkflowVersion:
    """Put proposal ``proposal`` (its place in the last pick's list) into the draft's step
    ``step_id``, field ``field``. Raises ``workflow_services.WorkflowError`` (an irreversible
    step asks for its id as confirmation) or ScratchError, in people's words."""
    session = scratch_get(scratch_id=scratch_id, user=user)
    proposals = (session.picked or {}).get("proposals") or []
    if not 0 <= proposal < len(proposals):
        raise ScratchError("that proposal is gone: pick the element again")
    target = Target.model_validate(proposals[proposal]["target"])
    steps = {str(s.get("id")): s for s in scratch_steps(session.workflow)}
    if step_id not in steps:
        raise ScratchError(f"the draft has no step '{step_id}' any more: reload the page")
    had = steps[step_id].get(field)
    return workflow_services.step_target_set(
        workflow_id=session.workflow_id,
        user=user,
        step_id=step_id,
        field=field,
        target=target.model_dump(exclude_defaults=True),
        expected=had if isinstance(had, dict) else None,
        confirm=confirm,
        extra={"scratch_session": session.pk, "matches": proposals[proposal].get("matches")},
    )


# What each kind of element is recorded as, by its role.
RECORDED_KINDS = {
    "textbox": "fill", "searchbox": "fill", "spinbutton": "fill", "combobox": "select",
    "listbox": "select", "checkbox": "check", "radio": "check", "switch": "check",
}  # fmt: skip
ValueAs = Literal["text", "parameter", "credential"]


def scratch_record(
    *,
    scratch_id: int,
    user: User,
    proposal: int,
    value: str = "",
    value_as: ValueAs = "text",
    name: str = "",
    after: str = "",
    irreversible: bool = False,
) -> tuple[str, str]:
    """Record what the author does with the element last picked, as a new step of the draft
    right after step ``after``: a click, or typing ``value`` (or choosing the option
    ``value``) into it, written as text, as a new parameter ``name`` (the value its default),
    or as the credential field ``name`` (``credential.field``). A field that takes a secret is
    only ever typed from a credential. The step is then done on the page, unless it is
    irreversible (a scratch session never does those). Returns the new step's id and why it
    was not done ('' when it is being done). Raises ScratchError or
    ``workflow_services.WorkflowError`` in people's words."""
    session = scratch_get(scratch_id=scratch_id, user=user)
    picked = session.picked or {}
    proposals = picked.get("proposals") or []
    if not 0 <= proposal < len(proposals):
        raise ScratchError("that proposal is gone: pick the element again")
    element = picked.get("element") or {}
    kind = RECORDED_KINDS.get(str(element.get("role") or ""), "click")
    step: dict[str, Any] = {"type": kind, "target": proposals[proposal]["target"]}
    step["id"] = new_step_id(session.workflow, kind, str(element.get("name") or ""))
    parameter: dict[str, Any] | None = None
    if kind == "click":
        step["irreversible"] = irreversible
    elif kind in ("fill", "select"):
        if picked.get("secret") and value_as != "credential":
            raise ScratchError(
                "this field takes a secret: type it from a credential, never from the workflow"
            )
        if value_as == "parameter":
            parameter = {
                "name": name,
                "type": "string",
                "label": name.replace("_", " ").capitalize(),
            }
            if value:
                parameter["default"] = value
            written = f"{{{{ params.{name} }}}}"
        elif value_as == "credential":
            credential, _, field = name.partition(".")
            if credential not in set(session.workflow.credentials.values_list("name", flat=True)):
                raise ScratchError(f"the workflow uses no credential '{credential}'")
            written = f"{{{{ secrets.{credential}.{field} }}}}"
        elif not value:
            raise ScratchError("type the value first")
        else:
            written = value
        step["value" if kind == "fill" else "option"] = written
    # One transaction with the session locked and busy from the start: a second click waits
    # for the first and is then refused (the browser is busy), instead of recording twice.
    with transaction.atomic():
        _refuse_unless_ready(_lock(scratch_id, user))
        if parameter is not None:
            workflow_services.parameter_save(
                workflow_id=session.workflow_id, user=user, data=parameter
            )
        workflow_services.step_insert(
            workflow_id=session.workflow_id,
            user=user,
            data=step,
            after=after,
            note=f"recorded in scratch session #{session.pk}",
        )
        if step.get("irreversible"):
            return step["id"], "irreversible: a scratch session never does it"
        asked = scratch_ask(scratch_id=scratch_id, user=user, action="try", step_id=step["id"])
    return step["id"], "" if asked.status == S.BUSY else asked.reason


def new_step_id(workflow: Workflow, kind: str, name: str, also_taken: Collection[str] = ()) -> str:
    """An id for a new step that does ``kind`` to the element named ``name``, unused by the
    working copy's steps and by ``also_taken`` ("fill-username", "click-sign-in-2")."""
    words = re.sub(r"[^a-z0-9]+", "-", name.casefold()).strip("-")[:40].strip("-")
    base = f"{kind}-{words}" if words else kind
    taken = {str(s.get("id")) for s in scratch_steps(workflow)} | set(also_taken)
    found = base
    number = 2
    while found in taken:
        found, number = f"{base}-{number}", number + 1
    return found


def scratch_close(
    *, scratch_id: int, user: User | None, reason: str = "", status: str = ""
) -> ScratchSession:
    """End the session and destroy its browser: closed by ``user``, or by the housekeeping
    (expired, or ``status``). Idempotent."""
    with transaction.atomic():
        session = ScratchSession.objects.select_for_update().get(pk=scratch_id)
        if user is not None and session.started_by_id != user.pk:
            raise ScratchSession.DoesNotExist
        if not session.is_open:
            return session
        expired = user is None
        status = status or (S.EXPIRED if expired else S.CLOSED)
        sandbox = _end(session, status, reason or ("its time ran out" if expired else "closed"))
        audit_record(
            action=f"scratch.{status}",
            object_type="scratch_session",
            object_id=session.pk,
            team_id=session.workflow.team_id,
            actor=user,
            after={"reason": session.reason},
        )
    if sandbox:
        destroy_sandbox(sandbox)
    shutil.rmtree(scratch_files_dir(scratch_id), ignore_errors=True)
    return session


def scratch_housekeeping() -> dict[str, list[int]]:
    """The reaper's rounds: end the sessions whose time ran out, fail those whose browser did
    not start in START_LIMIT, and free those whose work was not done in WORK_LIMIT (a worker
    that stopped, a task that failed): each says so instead of waiting forever. Idempotent."""
    now = timezone.now()
    report: dict[str, list[int]] = {"expired": [], "not_started": [], "work_lost": []}
    open_now = ScratchSession.objects.filter(status__in=ScratchSession.OPEN)
    for scratch_id in list(open_now.filter(expires_at__lte=now).values_list("pk", flat=True)):
        scratch_close(scratch_id=scratch_id, user=None)
        report["expired"].append(scratch_id)
    stuck = open_now.filter(status=S.STARTING, created_at__lte=now - START_LIMIT)
    for scratch_id in list(stuck.values_list("pk", flat=True)):
        minutes = int(START_LIMIT.total_seconds() // 60)
        scratch_close(
            scratch_id=scratch_id, user=None, status=S.FAILED,
            reason=f"the browser did not start within {minutes} minutes",
        )  # fmt: skip
        report["not_started"].append(scratch_id)
    lost = open_now.filter(status=S.BUSY, busy_since__lte=now - WORK_LIMIT)
    for scratch_id in list(lost.values_list("pk", flat=True)):
        with transaction.atomic():
            session = (
                ScratchSession.objects.select_for_update().defer("observation").get(pk=scratch_id)
            )
            if session.status != S.BUSY or session.busy_since is None:
                continue
            if session.busy_since > now - WORK_LIMIT:
                continue
            session.reason = f"{session.doing} was not done: its worker stopped; ask again"
            session.status, session.doing, session.busy_since = S.READY, "", None
            session.seq += 1
            session.save(update_fields=["reason", "status", "doing", "busy_since", "seq"])
            audit_record(
                action="scratch.work_lost",
                object_type="scratch_session",
                object_id=scratch_id,
                team_id=session.workflow.team_id,
                after={"reason": session.reason},
            )
        report["work_lost"].append(scratch_id)
    return report


def _lock(scratch_id: int, user: User) -> ScratchSession:
    session = (
        ScratchSession.objects.select_for_update()
        .select_related("workflow")
        .defer("observation")
        .get(pk=scratch_id, started_by=user)
    )
    if session.is_open and session.expires_at <= timezone.now():
        raise ScratchError("this scratch session's time ran out: open a new one")
    return session


def _refuse_unless_ready(session: ScratchSession) -> None:
    if session.status == S.STARTING:
        raise ScratchError("the browser is still starting")
    if session.status == S.BUSY:
        raise ScratchError(f"the browser is busy {session.doing}: wait until it is done")
    if not session.is_open:
        raise ScratchError(f"this scratch session has ended ({session.reason}): open a new one")


def _end(session: ScratchSession, status: str, reason: str) -> dict[str, Any] | None:
    """Mark the session (locked) ended; returns the sandbox to destroy after the commit."""
    sandbox = session.sandbox
    session.status = status
    session.reason = reason
    session.ended_at = timezone.now()
    session.sandbox = None
    session.doing = ""
    session.busy_since = None
    session.seq += 1
    session.save(
        update_fields=["status", "reason", "ended_at", "sandbox", "doing", "busy_since", "seq"]
    )
    return sandbox
