"""Scratch sessions: try the draft's steps and pick targets on a live page (thin views over
``sessions.services.scratch``)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.models import User
from django.http import FileResponse, Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from pandaweb.assist.errors import ModelUnavailable
from pandaweb.assist.models import ModelCall
from pandaweb.assist.services import assist_enabled
from pandaweb.core.http import AuthenticatedRequest
from pandaweb.core.permissions import capability_required
from pandaweb.core.roles import Capability
from sessions import scratch_assist
from sessions.engine.steps.language import IRREVERSIBLE_WORDS, Target
from sessions.models import ScratchSession
from sessions.services import scratch
from workflows import selectors as workflow_selectors
from workflows import services as workflow_services
from workflows.schema import STEP_ADAPTER, describe_step


@require_POST
@capability_required(Capability.AUTHOR_WORKFLOWS)
def scratch_open(request: AuthenticatedRequest, slug: str) -> HttpResponse:
    workflow = workflow_selectors.workflow_get(slug, user=request.user)
    try:
        session = scratch.scratch_open(workflow_id=workflow.pk, user=request.user)
    except scratch.ScratchError as exc:
        messages.error(request, f"No scratch session was opened: {exc}.")
        return redirect("workflows:detail", slug=slug)
    return redirect("runs:scratch", scratch_id=session.pk)


@require_GET
@capability_required(Capability.AUTHOR_WORKFLOWS)
def scratch_page(request: AuthenticatedRequest, scratch_id: int) -> HttpResponse:
    session = _session(request, scratch_id)
    template = "sessions/partials/_scratch.html" if request.htmx else "sessions/scratch.html"
    return render(request, template, _context(session, request.user))


@require_POST
@capability_required(Capability.AUTHOR_WORKFLOWS)
def scratch_ask(request: AuthenticatedRequest, scratch_id: int) -> HttpResponse:
    session = _session(request, scratch_id)
    action = request.POST.get("action", "")
    element = request.POST.get("element", "")
    errors: list[str] = []
    if action not in ("run_to", "try", "look", "pick"):
        errors.append("Nothing was asked: unknown action.")
    else:
        try:
            session = scratch.scratch_ask(
                scratch_id=session.pk,
                user=request.user,
                action=action,  # type: ignore[arg-type]
                step_id=request.POST.get("step_id", ""),
                element=int(element) if element.isdigit() else None,
                confirm=request.POST.get("confirm", ""),
            )
        except scratch.ScratchError as exc:
            errors.append(f"Nothing was asked: {exc}.")
    return _answer(request, session, errors)


@require_POST
@capability_required(Capability.AUTHOR_WORKFLOWS)
def scratch_use(request: AuthenticatedRequest, scratch_id: int) -> HttpResponse:
    session = _session(request, scratch_id)
    step_id, _, field = request.POST.get("step_field", "").partition(":")
    proposal = request.POST.get("proposal", "")
    element = request.POST.get("element", "")
    confirm = request.POST.get("confirm", "")
    errors: list[str] = []
    try:
        if element.isdigit():
            scratch.scratch_use_element(
                scratch_id=session.pk, user=request.user, step_id=step_id,
                field=field or "target", number=int(element), confirm=confirm,
            )  # fmt: skip
        else:
            scratch.scratch_use_target(
                scratch_id=session.pk, user=request.user, step_id=step_id,
                field=field or "target", proposal=int(proposal) if proposal.isdigit() else -1,
                confirm=confirm,
            )  # fmt: skip
    except scratch.ScratchError as exc:
        errors.append(f"The draft was not changed: {exc}.")
    except workflow_services.WorkflowError as exc:
        said = [m for ms in (exc.field_errors or {}).values() for m in ms] or [str(exc)]
        errors.extend(f"The draft was not changed: {message}." for message in said)
    else:
        messages.success(
            request, f"Step '{step_id}' of the draft now uses the target you picked ({field})."
        )
    return _answer(request, session, errors)


@require_POST
@capability_required(Capability.AUTHOR_WORKFLOWS)
def scratch_record(request: AuthenticatedRequest, scratch_id: int) -> HttpResponse:
    session = _session(request, scratch_id)
    value_as = request.POST.get("value_as", "text")
    proposal = request.POST.get("proposal", "")
    errors: list[str] = []
    try:
        step_id, not_done = scratch.scratch_record(
            scratch_id=session.pk,
            user=request.user,
            proposal=int(proposal) if proposal.isdigit() else -1,
            value=request.POST.get("value", ""),
            value_as="parameter"
            if value_as == "parameter"
            else "credential"
            if value_as == "credential"
            else "text",
            name=request.POST.get(f"{value_as}_name", ""),
            after=request.POST.get("after", ""),
            irreversible=request.POST.get("irreversible") == "on",
        )
    except scratch.ScratchError as exc:
        errors.append(f"Nothing was recorded: {exc}.")
    except workflow_services.WorkflowError as exc:
        said = [m for ms in (exc.field_errors or {}).values() for m in ms] or [str(exc)]
        errors.extend(f"Nothing was recorded: {message}." for message in said)
    else:
        done = f"not done here ({not_done})" if not_done else "doing it on the page now"
        messages.success(request, f"Recorded step '{step_id}' in the draft; {done}.")
    return _answer(request, session, errors)


@require_POST
@capability_required(Capability.AUTHOR_WORKFLOWS)
def scratch_assist_ask(request: AuthenticatedRequest, scratch_id: int) -> HttpResponse:
    session = _session(request, scratch_id)
    purpose = (
        ModelCall.Purpose.DRAFT
        if request.POST.get("action") == "draft"
        else ModelCall.Purpose.CHOOSE
    )
    errors: list[str] = []
    try:
        scratch_assist.scratch_assist_ask(
            scratch_id=session.pk,
            user=request.user,
            purpose=purpose,
            words=request.POST.get("words", ""),
        )
    except (scratch.ScratchError, ModelUnavailable) as exc:
        errors.append(f"Nothing was asked: {exc}.")
    return _answer(request, session, errors)


@require_POST
@capability_required(Capability.AUTHOR_WORKFLOWS)
def scratch_assist_add(request: AuthenticatedRequest, scratch_id: int) -> HttpResponse:
    session = _session(request, scratch_id)
    call_id = request.POST.get("call_id", "")
    errors: list[str] = []
    try:
        added = scratch_assist.scratch_assist_add(
            scratch_id=session.pk,
            user=request.user,
            call_id=int(call_id) if call_id.isdigit() else 0,
            after=request.POST.get("after", ""),
        )
    except scratch.ScratchError as exc:
        errors.append(f"Nothing was added: {exc}.")
    except workflow_services.WorkflowError as exc:
        said = [m for ms in (exc.field_errors or {}).values() for m in ms] or [str(exc)]
        errors.extend(f"Nothing was added: {message}." for message in said)
    else:
        messages.success(request, f"Added {len(added)} steps to the draft: {', '.join(added)}.")
    return _answer(request, session, errors)


@require_POST
@capability_required(Capability.AUTHOR_WORKFLOWS)
def scratch_close(request: AuthenticatedRequest, scratch_id: int) -> HttpResponse:
    session = _session(request, scratch_id)
    scratch.scratch_close(scratch_id=session.pk, user=request.user)
    messages.info(request, "The scratch session is closed and its browser destroyed.")
    return redirect("workflows:detail", slug=session.workflow.slug)


@require_GET
@capability_required(Capability.AUTHOR_WORKFLOWS)
def scratch_picture(request: AuthenticatedRequest, scratch_id: int, name: str) -> FileResponse:
    session = _session(request, scratch_id)
    path = scratch.scratch_files_dir(session.pk) / name
    if "/" in name or not name.endswith(".jpg") or not path.is_file():
        raise Http404("no such picture")
    response = FileResponse(path.open("rb"), content_type="image/jpeg")
    response["Cache-Control"] = "private, max-age=600"
    return response


def _session(request: AuthenticatedRequest, scratch_id: int) -> ScratchSession:
    try:
        return scratch.scratch_get(scratch_id=scratch_id, user=request.user)
    except ScratchSession.DoesNotExist:
        # Someone else's browser is nobody else's to see or drive.
        raise Http404("no such scratch session of yours") from None


def _answer(
    request: AuthenticatedRequest, session: ScratchSession, errors: list[str]
) -> HttpResponse:
    session.refresh_from_db()
    if request.htmx:
        context = {**_context(session, request.user), "errors": errors}
        return render(request, "sessions/partials/_scratch.html", context, status=200)
    for error in errors:
        messages.error(request, error)
    return redirect("runs:scratch", scratch_id=session.pk)


def _context(session: ScratchSession, user: User) -> dict[str, Any]:
    rows = []
    targets: list[dict[str, Any]] = []
    page_proposals = scratch.scratch_page_proposals(session)
    steps = scratch.scratch_steps(session.workflow)
    final = scratch.final_sounding(session.workflow, steps)
    picked_name = " ".join(
        str(((session.picked or {}).get("element") or {}).get("name") or "").split()
    ).casefold()
    for data in steps:
        try:
            step = STEP_ADAPTER.validate_python(data)
        except ValueError:
            rows.append(
                {"id": data.get("id", "?"), "sentence": "(does not read: fix it in the editor)"}
            )
            continue
        rows.append(
            {
                "id": step.id,
                "sentence": describe_step(step),
                "irreversible": step.irreversible,
                "asks": step.type == "ask",
                "final": step.id in final,
                "result": session.results.get(step.id),
                "page_proposals": [p for p in page_proposals if p.step_id == step.id],
            }
        )
        for name in step.target_fields():
            current = getattr(step, name, None)
            targets.append(
                {
                    "value": f"{step.id}:{name}",
                    "label": f"{step.id} · {name}",
                    # The step that already looks for an element of this name is the likely one.
                    "likely": bool(picked_name)
                    and isinstance(current, Target)
                    and current.readable_name.casefold() == picked_name,
                }
            )
    observation = session.observation or {}
    upcoming = observation.get("upcoming")
    call = scratch_assist.scratch_assist_latest(session, user)
    element = (session.picked or {}).get("element") or {}
    return {
        "record_kind": scratch.RECORDED_KINDS.get(str(element.get("role") or ""), "click"),
        "final_words": bool(IRREVERSIBLE_WORDS.search(str(element.get("name") or ""))),
        "credential_fields": scratch.scratch_credential_fields(session.workflow),
        # New steps go after the last step done on this page, by default.
        "record_after": rows[upcoming - 1]["id"]
        if isinstance(upcoming, int) and 0 < upcoming <= len(rows)
        else "",
        "session": session,
        "workflow": session.workflow,
        "rows": rows,
        "step_fields": targets,
        "elements": [e for e in observation.get("elements") or [] if e.get("box")],
        "width": observation.get("width") or 1280,
        "height": observation.get("height") or 900,
        "polling": session.status in (ScratchSession.Status.STARTING, ScratchSession.Status.BUSY)
        or (call is not None and call.status == ModelCall.Status.PENDING),
        "assist": assist_enabled(),
        "call": call,
        "chosen": scratch_assist.scratch_assist_chosen(session, call) if call else None,
        "drafted": scratch_assist.scratch_assist_drafted(session, call) if call else [],
        "refused": sorted((session.refused or {}).items()),
    }
