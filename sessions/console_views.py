"""The operations console's pages: the runs list, CSV export, saved views, re-run and failure
triage. Thin: parse the address, call one selector or service, render."""

from __future__ import annotations

import difflib
import json
import secrets
from typing import Any, Literal
from urllib.parse import urlencode

from django.contrib import messages
from django.http import Http404, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from pandaweb.core.http import AuthenticatedRequest
from pandaweb.core.permissions import capability_required, user_can
from pandaweb.core.roles import Capability
from sessions import console, console_services, selectors
from sessions.forms import LaunchForm
from sessions.models import Run
from sessions.services import RunError
from workflows import selectors as workflow_selectors
from workflows.schema import Parameter


def runs_context(request: AuthenticatedRequest, *, workflow: str = "") -> dict[str, Any]:
    """The runs list for the address's filters (also embedded on a workflow's page)."""
    flt = console.RunFilter.from_params(request.GET, workflow=workflow)
    page = console.run_page(flt, user=request.user, cursor=request.GET.get("after", "")[:200])
    return {
        "page": page,
        "live_query": console.live_query(flt, page),
        "filter": flt,
        "choices": console.filter_choices(request.user),
        "fixed_workflow": workflow,
        "sort_links": {key: flt.sort_query(key) for key in console.SORTS},
        "list_url": request.path,
        "can_launch": user_can(request.user, Capability.LAUNCH_RUNS),
    }


@require_GET
@capability_required(Capability.VIEW_RUNS)
def run_index(request: AuthenticatedRequest) -> HttpResponse:
    context = runs_context(request)
    context["saved_views"] = console.saved_views(request.user)
    template = "sessions/index.html"
    if request.htmx and request.htmx.target == "run-results":
        template += "#results"
    return _pushed(render(request, template, context), request, context)


def _pushed(
    response: HttpResponse, request: AuthenticatedRequest, context: dict[str, Any]
) -> HttpResponse:
    """For htmx: the address to push is the tidy one (no empty parameters), so what people
    bookmark or share reads like the filters they chose."""
    # Only for the list's own swaps: the workflow page loading its embedded list stays put.
    if request.htmx and request.htmx.target == "run-results":
        flt: console.RunFilter = context["filter"]
        params = flt.params()
        if context["fixed_workflow"]:
            params.pop("workflow", None)
        after = request.GET.get("after", "")[:200]
        if after:
            params["after"] = after
        query = urlencode(params)
        response["HX-Push-Url"] = f"{request.path}?{query}" if query else request.path
    return response


@require_GET
@capability_required(Capability.VIEW_RUNS)
def workflow_runs(request: AuthenticatedRequest, slug: str) -> HttpResponse:
    """One workflow's runs with the same filters (embedded on the workflow's page)."""
    workflow = workflow_selectors.workflow_get(slug, user=request.user)
    context = runs_context(request, workflow=workflow.slug)
    context["workflow"] = workflow
    template = "sessions/workflow_runs.html"
    if request.htmx and request.htmx.target == "run-results":
        template += "#results"
    elif request.htmx:
        template += "#panel"
    return _pushed(render(request, template, context), request, context)


@require_GET
@capability_required(Capability.VIEW_RUNS)
def run_export(request: AuthenticatedRequest) -> StreamingHttpResponse:
    """The current view (every page of it) as CSV."""
    flt = console.RunFilter.from_params(request.GET)
    stamp = timezone.now().strftime("%Y%m%d-%H%M")
    response = StreamingHttpResponse(
        console.run_csv_rows(flt, user=request.user), content_type="text/csv"
    )
    response["Content-Disposition"] = f'attachment; filename="runs-{stamp}.csv"'
    return response


@require_POST
@capability_required(Capability.VIEW_RUNS)
def saved_view_create(request: AuthenticatedRequest) -> HttpResponse:
    flt = console.RunFilter.from_params(request.POST)
    try:
        view = console_services.saved_view_save(
            user=request.user, name=request.POST.get("name", ""), query=flt.query()
        )
    except ValueError as exc:
        messages.error(request, f"Nothing was saved: {exc}.")
        return redirect(f"{reverse('runs:index')}?{flt.query()}")
    messages.info(request, f"Saved the view “{view.name}”.")
    return redirect(f"{reverse('runs:index')}?{view.query}")


@require_POST
@capability_required(Capability.VIEW_RUNS)
def saved_view_delete(request: AuthenticatedRequest, view_id: int) -> HttpResponse:
    if not console_services.saved_view_delete(user=request.user, view_id=view_id):
        raise Http404("no such saved view")
    messages.info(request, "Saved view deleted.")
    return redirect("runs:index")


@require_POST
@capability_required(Capability.VIEW_RUNS)
def run_dismiss(request: AuthenticatedRequest, run_id: int) -> HttpResponse:
    """Take a run that stopped before acting off the person's home page (their own mark)."""
    run = selectors.run_get(run_id, user=request.user)
    console_services.run_mark_seen(run=run, user=request.user)
    messages.info(request, f"Run #{run.pk} is off your home page; it stays in the runs list.")
    return redirect("home")


# Re-run -----------------------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@capability_required(Capability.LAUNCH_RUNS)
def run_rerun(request: AuthenticatedRequest, run_id: int) -> HttpResponse:
    """ "Run again with these inputs" (``?start=N``: continue a failed run from step N+1)."""
    original = selectors.run_get(run_id, user=request.user)
    data = request.POST if request.method == "POST" else request.GET
    try:
        start = max(0, int(data.get("start", "0") or 0))
    except ValueError:
        start = 0
    which: Literal["same", "latest"] = (
        "latest" if data.get("version") == "latest" and not start else "same"
    )
    latest = original.workflow.versions.filter(status="published").order_by("-number").first()
    version = latest if which == "latest" and latest is not None else original.version
    parameters = [
        Parameter.model_validate(p) for p in (version.document or {}).get("parameters", [])
    ]
    initial: dict[str, Any] = {
        "idempotency_key": secrets.token_urlsafe(16),
        "priority": original.priority,
    }
    for parameter in parameters:
        if parameter.name in original.inputs:
            initial[f"param_{parameter.name}"] = original.inputs[parameter.name]
    form = LaunchForm(request.POST or None, parameters=parameters, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            run, _ = console_services.run_rerun(
                run_id=original.pk,
                user=request.user,
                raw_inputs=form.raw_inputs(),
                version=which,
                start_index=start,
                idempotency_key=form.cleaned_data["idempotency_key"],
                priority=form.priority(),
            )
        except RunError as exc:
            if not exc.field_errors:
                form.add_error(None, str(exc))
            for name, errors in exc.field_errors.items():
                field = f"param_{name}" if f"param_{name}" in form.fields else None
                for error in errors:
                    form.add_error(field, error)
        else:
            return redirect("runs:detail", run_id=run.pk)
    steps = (original.version.document or {}).get("steps", [])
    context = {
        "original": original,
        "version": version,
        "latest": latest,
        "which": which,
        "start": start,
        "start_step": steps[start] if 0 < start < len(steps) else None,
        "form": form,
    }
    return render(request, "sessions/rerun.html", context)


# Failure triage --------------------------------------------------------------------------------


@require_GET
@capability_required(Capability.VIEW_RUNS)
def triage(request: AuthenticatedRequest) -> HttpResponse:
    try:
        days = min(90, max(1, int(request.GET.get("days", "14"))))
    except ValueError:
        days = 14
    groups = console.failure_groups(user=request.user, days=days)
    peak = max((max(g.per_day) for g in groups), default=0)
    return render(request, "sessions/triage.html", {"groups": groups, "days": days, "peak": peak})


def _observation_lines(step: Any) -> list[str]:
    if step is None or not step.observation:
        return []
    observation = step.observation
    if isinstance(observation, dict) and isinstance(observation.get("text"), str):
        return observation["text"].splitlines()
    return json.dumps(observation, indent=1, sort_keys=True, default=str).splitlines()


@require_GET
@capability_required(Capability.VIEW_RUNS)
def triage_compare(request: AuthenticatedRequest) -> HttpResponse:
    """Two failed runs' failing steps side by side, with what changed on the page."""
    try:
        left_id, right_id = int(request.GET["a"]), int(request.GET["b"])
    except (KeyError, ValueError):
        raise Http404("say which two runs (a and b)") from None
    left, right = (
        selectors.run_get(left_id, user=request.user),
        selectors.run_get(right_id, user=request.user),
    )
    left_step, right_step = console.failing_step(left), console.failing_step(right)
    left_lines, right_lines = _observation_lines(left_step), _observation_lines(right_step)
    diff = list(
        difflib.unified_diff(
            left_lines,
            right_lines,
            fromfile=f"run #{left.pk}",
            tofile=f"run #{right.pk}",
            lineterm="",
            n=2,
        )
    )[:800]
    context = {
        "sides": [(left, left_step), (right, right_step)],
        "diff": diff,
        "comparable": bool(left_lines and right_lines),
        "others": [
            other
            for other in console.triage_runs(
                user=request.user, workflow=left.workflow.slug, step=left.failure_step, reason=""
            )
            if other.pk not in (left.pk, right.pk)
        ],
    }
    return render(request, "sessions/compare.html", context)


def run_rerun_context(run: Run, user: Any) -> dict[str, Any]:
    """The run page's re-run panel: which steps a failed run may continue from, and why not."""
    checks = console_services.run_continue_checks(run)
    sentences = selectors.run_live_steps(run)[0] if checks else []
    ids = [step.get("id") for step in (run.version.document or {}).get("steps", [])]
    failed = ids.index(run.failure_step) if run.failure_step in ids else None
    return {
        "can_rerun": user_can(user, Capability.LAUNCH_RUNS, team_id=run.team_id)
        and not run.workflow.archived,
        "continue_checks": [
            {"check": check, "sentence": sentences[check.index], "failed": check.index == failed}
            for check in checks
        ],
        "reruns": list(run.reruns.order_by("-pk").values_list("pk", flat=True)[:20]),
    }
