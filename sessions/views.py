from __future__ import annotations

import mimetypes
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.http import FileResponse, Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRefresh

from pandaweb.assist import selectors as assist_selectors
from pandaweb.assist.errors import ModelUnavailable
from pandaweb.assist.services import assist_enabled
from pandaweb.core.http import AuthenticatedRequest
from pandaweb.core.permissions import capability_required, user_can
from pandaweb.core.roles import Capability
from sessions import (
    console,
    console_services,
    console_views,
    healing_services,
    rendering,
    selectors,
    services,
)
from sessions.engine.filmstrip import filmstrip_frames
from sessions.forms import LaunchForm
from workflows import selectors as workflow_selectors
from workflows import services as workflow_services
from workflows.models import Workflow
from workflows.schema import Parameter


@require_http_methods(["GET", "POST"])
@capability_required(Capability.LAUNCH_RUNS)
def run_launch(request: AuthenticatedRequest, slug: str) -> HttpResponse:
    workflow = workflow_selectors.workflow_get(slug, user=request.user)
    version = workflow_selectors.published_versions(workflow).first()
    if version is None:
        messages.error(request, "Publish a version of this workflow before launching it.")
        return redirect("workflows:detail", slug=slug)
    parameters = [
        Parameter.model_validate(p) for p in (version.document or {}).get("parameters", [])
    ]
    # A fresh key per form: submitting the same form twice (a double click, a resent POST)
    # launches one run.
    initial = {"idempotency_key": secrets.token_urlsafe(16)}
    form = LaunchForm(request.POST or None, parameters=parameters, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            run = services.run_launch(
                workflow_id=workflow.pk,
                user=request.user,
                raw_inputs=form.raw_inputs(),
                idempotency_key=form.cleaned_data["idempotency_key"],
                priority=form.priority(),
            )
        except services.IdempotencyKeyReused:
            form.add_error(
                None,
                "This form already launched a run with other inputs. Open the launch page "
                "again to start another run.",
            )
        except services.RunError as exc:
            if not exc.field_errors:
                form.add_error(None, str(exc))
            for name, errors in exc.field_errors.items():
                field = f"param_{name}" if f"param_{name}" in form.fields else None
                for error in errors:
                    form.add_error(field, error)
        else:
            return redirect("runs:detail", run_id=run.pk)
    context = {"workflow": workflow, "version": version, "form": form}
    return render(request, "sessions/launch.html", context)


@require_GET
@capability_required(Capability.VIEW_RUNS)
def run_detail(request: AuthenticatedRequest, run_id: int) -> HttpResponse:
    run = selectors.run_get(run_id, user=request.user)
    if run.launched_by_id == request.user.pk and run.status in run.FINAL:
        # The launcher now sees how it ended: the home page stops holding it up to them.
        console_services.run_mark_seen(run=run, user=request.user)
    sentences, current = selectors.run_live_steps(run)
    context = {
        "run": run,
        "steps": selectors.run_steps(run),
        "live_steps": sentences,
        "live_index": current,
        "live_now": sentences[current] if sentences else "",
        "can_control": user_can(request.user, Capability.CONTROL_RUNS, team_id=run.team_id),
        "still": None if run.is_final else rendering.live_still(run),
        "live_max_fps": settings.LIVE_MAX_FPS,
        "filmstrip": filmstrip_frames(services.run_files_dir(run.pk)),
        "denials": selectors.run_denials(run),
        "artifacts": run.artifacts.all(),
        "header": rendering.header_html(
            run, rendering.Viewer.of(request.user, team_id=run.team_id), request
        ),
        "queue": rendering.queue_context(run) if run.status == run.Status.QUEUED else None,
        **console_views.run_rerun_context(run, request.user),
    }
    return render(request, "sessions/detail.html", context)


@require_GET
@capability_required(Capability.VIEW_RUNS)
def step_detail(request: AuthenticatedRequest, run_id: int, index: int) -> HttpResponse:
    run = selectors.run_get(run_id, user=request.user)
    step = run.step_results.filter(index=index).first()
    if step is None:
        raise Http404("no such step")
    context = {
        "run": run,
        "step": step,
        "evidence": console.step_evidence(run, step),
        "can_heal": user_can(request.user, Capability.AUTHOR_WORKFLOWS)
        and healing_services.heal_available(run=run, result=step),
    }
    return render(request, "sessions/step.html", context)


@require_POST
@capability_required(Capability.LAUNCH_RUNS)
def run_cancel(request: AuthenticatedRequest, run_id: int) -> HttpResponse:
    run = selectors.run_get(run_id, user=request.user)
    services.run_cancel(run_id=run.pk, user=request.user)
    messages.info(request, f"Run #{run.pk} cancelled; its browser is gone.")
    return redirect("runs:detail", run_id=run.pk)


@require_POST
@capability_required(Capability.DECIDE_APPROVALS)
def run_reconcile(request: AuthenticatedRequest, run_id: int) -> HttpResponse:
    run = selectors.run_get(run_id, user=request.user)
    happened = request.POST.get("happened")
    if happened not in ("yes", "no"):
        return HttpResponse("say whether the action happened", status=400)
    try:
        services.run_reconcile(
            run_id=run.pk,
            user=request.user,
            happened=happened == "yes",
            note=request.POST.get("note", ""),
        )
    except services.RunError as exc:
        messages.error(request, f"Nothing was recorded: {exc}.")
    else:
        messages.info(request, f"Run #{run.pk} reconciled.")
    if request.htmx:
        # The page shows the outcome (or the refusal) once it reloads.
        return HttpResponseClientRefresh()
    return redirect("runs:detail", run_id=run.pk)


@require_GET
@capability_required(Capability.VIEW_RUNS)
def run_file(request: AuthenticatedRequest, run_id: int, path: str) -> FileResponse:
    """A screenshot, thumbnail or download of a run, for people who may see runs only."""
    run = selectors.run_get(run_id, user=request.user)
    root = (Path(settings.RUN_FILES_DIR) / str(run.pk)).resolve()
    target = (root / path).resolve()
    if not target.is_relative_to(root) or not target.is_file():
        raise Http404("no such file")
    content_type = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
    as_attachment = not content_type.startswith("image/")
    response = FileResponse(
        target.open("rb"), content_type=content_type, as_attachment=as_attachment
    )
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "default-src 'none'; img-src 'self'; sandbox"
    return response


# Session templates --------------------------------------------------------------------------------


def session_template_context(request: AuthenticatedRequest, workflow: Workflow) -> dict[str, Any]:
    """What the session template panel needs (also on the workflow's page)."""
    return {
        "workflow": workflow,
        "panel": selectors.session_template_panel(workflow, backend=settings.SANDBOX_BACKEND),
        "can_rebake": user_can(request.user, Capability.LAUNCH_RUNS, team_id=workflow.team_id)
        and not workflow.archived,
    }


@require_GET
@capability_required(Capability.VIEW_WORKFLOWS)
def session_template(request: AuthenticatedRequest, slug: str) -> HttpResponse:
    """The panel alone: what a page polls while a bake runs."""
    workflow = workflow_selectors.workflow_get(slug, user=request.user)
    context = session_template_context(request, workflow)
    if context["panel"] is None:
        raise Http404("this workflow has no session template")
    return render(request, "sessions/partials/_session_template.html", context)


@require_POST
@capability_required(Capability.LAUNCH_RUNS)
def session_template_bake(request: AuthenticatedRequest, slug: str) -> HttpResponse:
    """Re-bake the session template of the latest published version now."""
    workflow = workflow_selectors.workflow_get(slug, user=request.user)
    version = workflow_selectors.published_versions(workflow).first()
    if version is None:
        messages.error(request, "Publish a version of this workflow first.")
    else:
        try:
            template = services.template_request_bake(
                version_id=version.pk, user=request.user, backend=settings.SANDBOX_BACKEND
            )
        except services.TemplateError as exc:
            messages.error(request, f"Nothing was baked: {exc}.")
        else:
            messages.info(
                request, f"Baking session template #{template.pk}; runs fork it once it is ready."
            )
    context = session_template_context(request, workflow)
    if request.htmx and context["panel"] is not None:
        return render(request, "sessions/partials/_session_template.html", context)
    return redirect("workflows:detail", slug=slug)


# Healing a failed step's target -------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@capability_required(Capability.VIEW_RUNS)
@capability_required(Capability.AUTHOR_WORKFLOWS)
def step_heal(request: AuthenticatedRequest, run_id: int, index: int) -> HttpResponse:
    run = selectors.run_get(run_id, user=request.user)
    result = run.step_results.filter(index=index).first()
    if result is None:
        raise Http404("no such step")
    # A question to the model this person asked about this step: its answer, or the wait for it.
    call_id = request.GET.get("call", "")
    call = (
        assist_selectors.model_call_get(
            int(call_id), user=request.user, run_id=run.pk, step_index=index
        )
        if call_id.isdigit()
        else None
    )
    field = call.target_field if call else request.POST.get("field") or request.GET.get("field", "")
    try:
        proposal = healing_services.heal_proposal(
            run=run, result=result, user=request.user, field=field
        )
    except healing_services.HealingUnavailable as exc:
        messages.error(request, f"This step cannot be healed: {exc}.")
        return redirect("runs:step", run_id=run.pk, index=index)
    errors: dict[str, list[str]] = {}
    action = request.POST.get("action", "") if request.method == "POST" else ""
    try:
        if action in ("rank", "describe"):
            call = (
                healing_services.heal_rank_ask(proposal=proposal, user=request.user)
                if action == "rank"
                else healing_services.heal_describe_ask(
                    proposal=proposal,
                    user=request.user,
                    description=request.POST.get("description", ""),
                )
            )
            query = urlencode({"field": proposal.field, "call": call.pk})
            return redirect(f"{reverse('runs:heal', args=[run.pk, index])}?{query}")
        if request.method == "POST":
            number = request.POST.get("number", "")
            healing_services.heal_apply(
                proposal=proposal,
                user=request.user,
                number=int(number) if number.isdigit() else None,
                written=request.POST.get("target", ""),
                confirm=request.POST.get("confirm", ""),
            )
            messages.success(
                request,
                f"The draft now points step '{proposal.step.id}' at the new target. Review it "
                "and publish: runs use it from the next version.",
            )
            return redirect("workflows:detail", slug=run.version.workflow.slug)
    except (ModelUnavailable, healing_services.HealingUnavailable) as exc:
        errors = {action: [f"Nothing was proposed: {exc}."]}
    except workflow_services.WorkflowError as exc:
        errors = exc.field_errors or {"": [str(exc)]}
    unanswered = ""
    if call is not None and call.status != call.Status.PENDING:
        try:
            proposal = healing_services.heal_answered(proposal=proposal, call=call)
        except healing_services.HealingUnavailable as exc:
            unanswered = f"Nothing was proposed: {exc}."
    context = {
        "run": run,
        "result": result,
        "proposal": proposal,
        "errors": errors,
        "assist": assist_enabled(),
        "call": call,
        "unanswered": unanswered,
        # Asked when the run's step is irreversible, and whenever the draft's turns out to be.
        "confirm": proposal.step.irreversible or "confirm" in errors,
        "pictures": result.screenshot and run.files_pruned_at is None,
    }
    # While the model is asked, the page polls its proposal: the candidates and what the model
    # made of them.
    template = "sessions/heal.html#proposal" if request.htmx else "sessions/heal.html"
    return render(request, template, context, status=400 if errors else 200)


@require_GET
@capability_required(Capability.VIEW_RUNS)
@capability_required(Capability.AUTHOR_WORKFLOWS)
def step_heal_picture(
    request: AuthenticatedRequest, run_id: int, index: int, number: int
) -> HttpResponse:
    run = selectors.run_get(run_id, user=request.user)
    result = run.step_results.filter(index=index).first()
    if result is None:
        raise Http404("no such step")
    try:
        picture = healing_services.element_picture(
            run=run, result=result, user=request.user, number=number
        )
    except healing_services.HealingUnavailable as exc:
        raise Http404(str(exc)) from None
    response = HttpResponse(picture, content_type="image/png")
    response["Cache-Control"] = "private, max-age=300"
    return response
