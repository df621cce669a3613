from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from pandaweb.core.http import AuthenticatedRequest
from pandaweb.core.permissions import capability_required, user_can
from pandaweb.core.roles import Capability
from pandaweb.schedules import cron, selectors, services
from pandaweb.schedules.forms import BatchUploadForm, ScheduleForm
from sessions.services import concurrency_limit
from workflows import selectors as workflow_selectors
from workflows.models import Workflow, WorkflowVersion
from workflows.schema import Parameter


def _version(workflow: Workflow) -> WorkflowVersion | None:
    return workflow_selectors.published_versions(workflow).first()


def _parameters(version: WorkflowVersion | None) -> list[Parameter]:
    if version is None:
        return []
    return [Parameter.model_validate(p) for p in (version.document or {}).get("parameters", [])]


def _spec(form: ScheduleForm) -> services.ScheduleSpec:
    data = form.cleaned_data
    return services.ScheduleSpec(
        name=data["name"],
        cron=data["cron"],
        timezone=data["timezone"].strip(),
        inputs=form.raw_inputs(),
        overlap=data["overlap"],
        missed=data["missed"],
    )


def _add_errors(form: ScheduleForm, exc: services.ScheduleError) -> None:
    if not exc.field_errors:
        form.add_error(None, str(exc))
    for name, errors in exc.field_errors.items():
        field = name if name in form.fields else f"param_{name}"
        for error in errors:
            form.add_error(field if field in form.fields else None, error)


@require_http_methods(["GET", "POST"])
@capability_required(Capability.LAUNCH_RUNS)
def schedule_create(request: AuthenticatedRequest, slug: str) -> HttpResponse:
    workflow = workflow_selectors.workflow_get(slug, user=request.user)
    version = _version(workflow)
    if version is None or workflow.archived:
        messages.error(request, "Publish a version of this workflow before scheduling it.")
        return redirect("workflows:detail", slug=slug)
    form = ScheduleForm(request.POST or None, parameters=_parameters(version))
    if request.method == "POST" and form.is_valid():
        try:
            schedule = services.schedule_create(
                workflow_id=workflow.pk, user=request.user, spec=_spec(form)
            )
        except services.ScheduleError as exc:
            _add_errors(form, exc)
        else:
            messages.success(request, f"Schedule saved: {selectors.schedule_in_words(schedule)}.")
            return redirect("schedules:detail", schedule_id=schedule.pk)
    context = {"workflow": workflow, "version": version, "form": form, "schedule": None}
    return render(request, "schedules/form.html", context)


@require_http_methods(["GET", "POST"])
@capability_required(Capability.VIEW_WORKFLOWS)
def schedule_detail(request: AuthenticatedRequest, schedule_id: int) -> HttpResponse:
    schedule = selectors.schedule_get(schedule_id, user=request.user)
    workflow = schedule.workflow
    can_edit = user_can(request.user, Capability.LAUNCH_RUNS, team_id=workflow.team_id)
    version = _version(workflow)
    initial: dict[str, Any] = {
        "name": schedule.name,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "overlap": schedule.overlap,
        "missed": schedule.missed,
        **{f"param_{k}": v for k, v in schedule.inputs.items()},
    }
    form = ScheduleForm(request.POST or None, parameters=_parameters(version), initial=initial)
    if request.method == "POST":
        if not can_edit:
            messages.error(request, "Only people who may launch runs change schedules.")
            return redirect("schedules:detail", schedule_id=schedule.pk)
        if form.is_valid():
            try:
                services.schedule_update(
                    schedule_id=schedule.pk, user=request.user, spec=_spec(form)
                )
            except services.ScheduleError as exc:
                _add_errors(form, exc)
            else:
                messages.success(request, "Schedule saved.")
                return redirect("schedules:detail", schedule_id=schedule.pk)
    context = {
        "workflow": workflow,
        "version": version,
        "schedule": schedule,
        "form": form,
        "can_edit": can_edit,
        "in_words": selectors.schedule_in_words(schedule),
        "next_times": selectors.schedule_next_times(schedule),
    }
    return render(request, "schedules/form.html", context)


@require_GET
@capability_required(Capability.VIEW_WORKFLOWS)
def schedule_preview(request: AuthenticatedRequest) -> HttpResponse:
    """The expression in words and its next five times, while a person types it."""
    expression = request.GET.get("cron", "").strip()
    zone_name = request.GET.get("timezone", "").strip() or "UTC"
    context: dict[str, Any] = {"words": "", "times": [], "error": "", "zone": zone_name}
    if expression:
        try:
            context["times"] = cron.next_times(expression, zone_name, timezone.now(), 5)
            context["words"] = cron.describe(expression, zone_name)
        except cron.CronError as exc:
            context["error"] = str(exc)
    return render(request, "schedules/partials/_preview.html", context)


@require_POST
@capability_required(Capability.LAUNCH_RUNS)
def schedule_pause(request: AuthenticatedRequest, schedule_id: int) -> HttpResponse:
    schedule = selectors.schedule_get(schedule_id, user=request.user)
    paused = request.POST.get("paused") == "1"
    try:
        services.schedule_set_paused(schedule_id=schedule.pk, user=request.user, paused=paused)
    except services.ScheduleError as exc:
        messages.error(request, f"{exc}.")
    else:
        messages.success(request, f"“{schedule.name}” {'paused' if paused else 'resumed'}.")
    if request.POST.get("next") == "workflow":
        return redirect("workflows:detail", slug=schedule.workflow.slug)
    return redirect("schedules:detail", schedule_id=schedule.pk)


@require_http_methods(["GET", "POST"])
@capability_required(Capability.LAUNCH_RUNS)
def batch_create(request: AuthenticatedRequest, slug: str) -> HttpResponse:
    workflow = workflow_selectors.workflow_get(slug, user=request.user)
    version = _version(workflow)
    if version is None or workflow.archived:
        messages.error(request, "Publish a version of this workflow before launching a batch.")
        return redirect("workflows:detail", slug=slug)
    form = BatchUploadForm(request.POST or None, request.FILES or None)
    problems: list[str] = []
    summary = ""
    if request.method == "POST" and form.is_valid():
        upload = form.cleaned_data["file"]
        try:
            batch = services.batch_create(
                workflow_id=workflow.pk,
                user=request.user,
                filename=upload.name or "upload.csv",
                # One byte past the limit is enough to refuse it; never read a huge file whole.
                content=upload.read(settings.BATCH_MAX_BYTES + 1),
            )
        except services.BatchRefused as exc:
            summary, problems = str(exc), exc.problems
        else:
            return redirect("schedules:batch", batch_id=batch.pk)
    context = {
        "workflow": workflow,
        "version": version,
        "parameters": _parameters(version),
        "form": form,
        "summary": summary,
        "problems": problems,
        "bound": concurrency_limit(workflow),
    }
    return render(request, "schedules/batch_new.html", context, status=400 if summary else 200)


@require_GET
@capability_required(Capability.LAUNCH_RUNS)
def batch_template(request: AuthenticatedRequest, slug: str) -> HttpResponse:
    """An empty file with the right header line, to fill in a spreadsheet."""
    workflow = workflow_selectors.workflow_get(slug, user=request.user)
    names = [p.name for p in _parameters(_version(workflow))]
    response = HttpResponse(",".join(names) + "\r\n", content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{workflow.slug}-batch.csv"'
    return response


@require_GET
@capability_required(Capability.VIEW_RUNS)
def batch_detail(request: AuthenticatedRequest, batch_id: int) -> HttpResponse:
    batch = selectors.batch_get(batch_id, user=request.user)
    context = {"batch": batch, "progress": selectors.batch_progress(batch)}
    template = "schedules/batch.html"
    if request.htmx:
        template += "#progress"
    return render(request, template, context)


@require_GET
@capability_required(Capability.VIEW_RUNS)
def batch_outputs(request: AuthenticatedRequest, batch_id: int) -> HttpResponse:
    batch = selectors.batch_get(batch_id, user=request.user)
    response = HttpResponse(
        services.batch_outputs_csv(batch), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="batch-{batch.pk}-outputs.csv"'
    return response
