from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect, reswap, retarget

from pandaweb.core.http import AuthenticatedRequest
from pandaweb.core.permissions import capability_required, is_admin, sees_several_teams, user_can
from pandaweb.core.roles import Capability
from sessions import selectors as session_selectors
from sessions.engine.steps.language import Target
from workflows import selectors, services
from workflows.diff import document_diff
from workflows.forms import (
    CredentialForm,
    CredentialValueForm,
    ImportForm,
    ParameterForm,
    SessionCheckForm,
    StepForm,
    WorkflowCreateForm,
    WorkflowSettingsForm,
    lines,
    offer_team_choice,
)
from workflows.models import Credential, Workflow
from workflows.schema import SESSION_STEP_TYPES, STEP_LABELS, STEP_TYPES, Parameter

STEP_PALETTE = list(STEP_LABELS.items())


# What a session template may do: get to a logged-in page.
SESSION_PALETTE = [(kind, label) for kind, label in STEP_PALETTE if kind in SESSION_STEP_TYPES]


def _editable(request: AuthenticatedRequest, workflow: Workflow | None = None) -> bool:
    """Whether the person may author ``workflow`` (its team's), or workflows somewhere."""
    return user_can(
        request.user,
        Capability.AUTHOR_WORKFLOWS,
        team_id=workflow.team_id if workflow is not None else None,
    )


def _workflow(request: AuthenticatedRequest, slug: str, *, author: bool = False) -> Workflow:
    """The workflow, 404 when it is another team's; with ``author``, 403 for someone who sees it
    but may not change it (a reviewer of its team who also authors in another)."""
    workflow = selectors.workflow_get(slug, user=request.user)
    if author and not _editable(request, workflow):
        raise PermissionDenied(f"You may not change {workflow.team}'s workflows.")
    return workflow


def _editor_context(request: AuthenticatedRequest, workflow: Workflow) -> dict[str, Any]:
    draft = selectors.draft_of(workflow)
    review = services.draft_review(workflow, draft) if draft is not None else None
    working = selectors.working_copy(workflow)
    session = (working.session if working else None) or None
    versions = selectors.published_versions(workflow)
    latest = versions.first()
    setting_views = selectors.settings_views(
        latest.document if latest is not None else None,
        services.draft_canonical_data(workflow, draft) if draft is not None else None,
    )
    return {
        "workflow": workflow,
        "draft": draft,
        "steps": selectors.step_views(working.steps) if working else [],
        "session": session,
        "session_steps": selectors.step_views(session.get("steps", [])) if session else [],
        "session_check": selectors.session_check_view(session) if session else None,
        "session_palette": SESSION_PALETTE,
        "parameters": [Parameter.model_validate(p) for p in working.parameters] if working else [],
        "review": review,
        "versions": versions,
        "settings": setting_views,
        "settings_changed": sum(row.draft is not None for row in setting_views),
        "palette": STEP_PALETTE,
        "can_edit": _editable(request, workflow) and not workflow.archived,
        "can_author": _editable(request, workflow),
        "can_launch": user_can(request.user, Capability.LAUNCH_RUNS, team_id=workflow.team_id),
        "session_panel": session_selectors.session_template_panel(
            workflow, backend=settings.SANDBOX_BACKEND
        ),
        "can_rebake": user_can(request.user, Capability.LAUNCH_RUNS, team_id=workflow.team_id)
        and not workflow.archived,
    }


def _editor_response(request: AuthenticatedRequest, workflow: Workflow) -> HttpResponse:
    """After a change: the draft part of the page for htmx, a redirect without JavaScript."""
    if request.htmx:
        response = render(
            request, "workflows/detail.html#draft", _editor_context(request, workflow)
        )
        return reswap(retarget(response, "#draft"), "outerHTML")
    return redirect("workflows:detail", slug=workflow.slug)


def _add_service_errors(form: forms.Form, exc: services.WorkflowError) -> None:
    """Put a refused change's messages on the form fields they name (others on the form)."""
    for field, errors in exc.field_errors.items():
        for error in errors:
            form.add_error(field if field in form.fields else None, error)


def _refused(
    request: AuthenticatedRequest, workflow: Workflow, error: services.WorkflowError
) -> HttpResponse:
    messages.error(request, str(error))
    return _editor_response(request, workflow)


# Lists and creation -----------------------------------------------------------------------------


@require_GET
@capability_required(Capability.VIEW_WORKFLOWS)
def workflow_index(request: AuthenticatedRequest) -> HttpResponse:
    search = request.GET.get("q", "").strip()
    archived = request.GET.get("archived") == "1"
    context = {
        "workflows": selectors.workflow_list(user=request.user, search=search, archived=archived),
        "show_team": sees_several_teams(request.user, Capability.VIEW_WORKFLOWS),
        "search": search,
        "archived": archived,
        "can_author": _editable(request),
    }
    template = "workflows/index.html#results" if request.htmx else "workflows/index.html"
    return render(request, template, context)


@require_http_methods(["GET", "POST"])
@capability_required(Capability.AUTHOR_WORKFLOWS)
def workflow_create(request: AuthenticatedRequest) -> HttpResponse:
    form = WorkflowCreateForm(request.POST or None)
    offer_team_choice(form, selectors.authoring_teams(request.user))
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            workflow = services.workflow_create(
                user=request.user,
                team=data.get("team") or None,
                name=data["name"],
                slug=data["slug"],
                description=data["description"],
                reviewer_group=data["reviewer_group"],
                allowed_hosts=lines(data["allowed_hosts"]),
            )
        except services.WorkflowError as exc:
            _add_service_errors(form, exc)
        else:
            messages.success(request, f"Workflow '{workflow.name}' created. Add its steps.")
            return redirect("workflows:detail", slug=workflow.slug)
    return render(request, "workflows/create.html", {"form": form})


@require_http_methods(["GET", "POST"])
@capability_required(Capability.AUTHOR_WORKFLOWS)
def workflow_import(request: AuthenticatedRequest) -> HttpResponse:
    form = ImportForm(request.POST or None, request.FILES or None)
    offer_team_choice(
        form,
        selectors.authoring_teams(request.user),
        required=False,
        help_text="For a new workflow; a new draft of an existing one stays in its team.",
    )
    problems: list[str] = []
    if request.method == "POST" and form.is_valid():
        upload = form.cleaned_data["file"]
        if upload.size > 1_000_000:
            form.add_error("file", "the file is larger than 1 MB")
        else:
            try:
                workflow = services.workflow_import(
                    user=request.user,
                    text=upload.read(),
                    team=form.cleaned_data.get("team") or None,
                )
            except services.ImportUnchanged as exc:
                messages.info(request, f"Nothing was imported: {exc}; no draft was made.")
                return redirect("workflows:detail", slug=exc.workflow.slug)
            except services.ImportRefused as exc:
                problems = [str(p) for p in exc.problems]
            except services.WorkflowError as exc:
                problems = [str(exc)]
            else:
                messages.success(
                    request, f"Imported '{workflow.name}' as a draft. Review and publish it."
                )
                return redirect("workflows:detail", slug=workflow.slug)
    return render(request, "workflows/import.html", {"form": form, "problems": problems})


# The editor -------------------------------------------------------------------------------------


@require_GET
@capability_required(Capability.VIEW_WORKFLOWS)
def workflow_detail(request: AuthenticatedRequest, slug: str) -> HttpResponse:
    workflow = _workflow(request, slug)
    return render(request, "workflows/detail.html", _editor_context(request, workflow))


@require_http_methods(["GET", "POST"])
@capability_required(Capability.AUTHOR_WORKFLOWS)
def workflow_settings(request: AuthenticatedRequest, slug: str) -> HttpResponse:
    workflow = _workflow(request, slug, author=True)
    initial = WorkflowSettingsForm.initial_from(workflow)
    form = WorkflowSettingsForm(request.POST or None, initial=initial)
    # Only the workflow's team's credentials may be chosen (the service refuses others).
    form.fields["credentials"].queryset = Credential.objects.filter(  # type: ignore[attr-defined]
        team=workflow.team
    ).order_by("name")
    if not is_admin(request.user):
        # Offering a workflow to AI agents is an administrator's call (the service checks too).
        form.fields["offer_as_tool"].disabled = True
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            services.workflow_update_settings(
                workflow_id=workflow.pk,
                user=request.user,
                name=data["name"],
                description=data["description"],
                reviewer_group=data["reviewer_group"],
                allowed_hosts=lines(data["allowed_hosts"]),
                step_budget=data["step_budget"],
                run_ttl_minutes=data["run_ttl_minutes"],
                max_concurrent_runs=data["max_concurrent_runs"],
                approval_quorum=data["approval_quorum"],
                approval_expiry_minutes=data["approval_expiry_minutes"],
                author_may_approve=data["author_may_approve"],
                credentials=list(data["credentials"]),
                approval_remind_before_minutes=data["approval_remind_before_minutes"],
                approval_escalate_after_minutes=data["approval_escalate_after_minutes"],
                approval_escalation_group=(
                    data["approval_escalation_group"].name
                    if data["approval_escalation_group"]
                    else ""
                ),
                approval_reach=form.approval_reach(),
                recording=form.recording(),
                offer_as_tool=data["offer_as_tool"],
            )
        except services.WorkflowError as exc:
            if not exc.field_errors:
                form.add_error(None, str(exc))
            _add_service_errors(form, exc)
        else:
            latest = selectors.published_versions(workflow).first()
            if selectors.draft_of(workflow) is None:
                messages.success(request, "Settings saved.")
            elif latest is None:
                messages.success(request, "Settings saved in the draft.")
            else:
                messages.success(
                    request,
                    f"Settings saved in the draft. Runs keep the settings of v{latest.number} "
                    "until you publish it.",
                )
            return redirect("workflows:detail", slug=workflow.slug)
    return render(request, "workflows/settings.html", {"workflow": workflow, "form": form})


@require_http_methods(["GET", "POST"])
@capability_required(Capability.AUTHOR_WORKFLOWS)
def step_edit(
    request: AuthenticatedRequest, slug: str, index: int | None = None, session: bool = False
) -> HttpResponse:
    """Add a step (``index`` None, type from ``?type=``) or edit the step at ``index``; with
    ``session``, a step of the session template."""
    workflow = _workflow(request, slug, author=True)
    draft = selectors.working_copy(workflow)
    existing = None
    allowed = SESSION_STEP_TYPES if session else STEP_TYPES
    if index is not None:
        steps = _draft_steps(draft, session=session)
        if not 0 <= index < len(steps):
            raise Http404("no such step")
        existing = steps[index]
        step_type = str(existing.get("type"))
    else:
        step_type = request.POST.get("type") or request.GET.get("type", "")
        if step_type not in allowed:
            raise Http404("no such step type")
    initial = (
        StepForm.initial_from_step(existing) if existing else {"id": _fresh_id(draft, step_type)}
    )
    form = StepForm(request.POST or None, step_type=step_type, initial=initial, session=session)
    if request.method == "POST" and form.is_valid():
        data = form.to_data()
        if data is not None:
            try:
                services.step_save(
                    workflow_id=workflow.pk,
                    user=request.user,
                    data=data,
                    index=index,
                    session=session,
                )
            except services.WorkflowError as exc:
                if not exc.field_errors:
                    form.add_error(None, str(exc))
                form.add_schema_errors(exc.field_errors)
            else:
                return _editor_response(request, workflow)
    prefix = "workflows:session_step" if session else "workflows:step"
    context = {
        "workflow": workflow,
        "form": form,
        "step_type": step_type,
        "index": index,
        "session": session,
        "type_label": dict(STEP_PALETTE)[step_type],
        "form_url": reverse(f"{prefix}_add", kwargs={"slug": slug})
        if index is None
        else reverse(f"{prefix}_edit", kwargs={"slug": slug, "index": index}),
    }
    template = "workflows/step_form.html#form" if request.htmx else "workflows/step_form.html"
    return render(request, template, context)


def _draft_steps(draft: Any, *, session: bool) -> list[dict[str, Any]]:
    if draft is None:
        return []
    if session:
        return list((draft.session or {}).get("steps", []))
    return list(draft.steps)


def _fresh_id(draft: Any, step_type: str) -> str:
    # Unique across the run's steps and the session template's.
    taken = {
        s.get("id") for s in _draft_steps(draft, session=False) + _draft_steps(draft, session=True)
    }
    base = step_type.replace("_", "-")
    n = 1
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


@require_POST
@capability_required(Capability.AUTHOR_WORKFLOWS)
def step_action(
    request: AuthenticatedRequest, slug: str, index: int, action: str, session: bool = False
) -> HttpResponse:
    workflow = _workflow(request, slug, author=True)
    step_id = request.POST.get("step_id", "")
    user, pk = request.user, workflow.pk
    try:
        if action == "delete":
            services.step_delete(
                workflow_id=pk, user=user, index=index, step_id=step_id, session=session
            )
        elif action == "duplicate":
            services.step_duplicate(
                workflow_id=pk, user=user, index=index, step_id=step_id, session=session
            )
        elif action in ("up", "down"):
            to_index = index + (-1 if action == "up" else 1)
            services.step_move(
                workflow_id=pk,
                user=user,
                index=index,
                step_id=step_id,
                to_index=to_index,
                session=session,
            )
        else:
            raise Http404("no such action")
    except services.WorkflowError as exc:
        return _refused(request, workflow, exc)
    return _editor_response(request, workflow)


@require_http_methods(["GET", "POST"])
@capability_required(Capability.AUTHOR_WORKFLOWS)
def session_edit(request: AuthenticatedRequest, slug: str) -> HttpResponse:
    """The session template's logged-in check: its page, its target, how often it is re-baked."""
    workflow = _workflow(request, slug, author=True)
    draft = selectors.working_copy(workflow)
    session = (draft.session if draft else None) or {}
    initial: dict[str, Any] = {"rebake_every_hours": 12}
    if session:
        initial = {
            "check_url": session.get("check_url", ""),
            "logged_in": Target.model_validate(session["logged_in"]).to_compact()
            if session.get("logged_in")
            else "",
            "rebake_every_hours": session.get("rebake_every_hours", 12),
        }
    form = SessionCheckForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            services.session_check_save(
                workflow_id=workflow.pk,
                user=request.user,
                check_url=data["check_url"],
                logged_in=form.logged_in_target(),
                rebake_every_hours=data["rebake_every_hours"],
            )
        except services.WorkflowError as exc:
            if not exc.field_errors:
                form.add_error(None, str(exc))
            _add_service_errors(form, exc)
        else:
            return _editor_response(request, workflow)
    context = {"workflow": workflow, "form": form, "new": not session}
    template = "workflows/session_form.html#form" if request.htmx else "workflows/session_form.html"
    return render(request, template, context)


@require_POST
@capability_required(Capability.AUTHOR_WORKFLOWS)
def session_remove(request: AuthenticatedRequest, slug: str) -> HttpResponse:
    workflow = _workflow(request, slug, author=True)
    try:
        services.session_remove(workflow_id=workflow.pk, user=request.user)
    except services.WorkflowError as exc:
        return _refused(request, workflow, exc)
    return _editor_response(request, workflow)


@require_http_methods(["GET", "POST"])
@capability_required(Capability.AUTHOR_WORKFLOWS)
def parameter_edit(
    request: AuthenticatedRequest, slug: str, index: int | None = None
) -> HttpResponse:
    workflow = _workflow(request, slug, author=True)
    draft = selectors.working_copy(workflow)
    initial: dict[str, Any] = {"required": True}
    if index is not None:
        parameters = draft.parameters if draft else []
        if not 0 <= index < len(parameters):
            raise Http404("no such parameter")
        initial = ParameterForm.initial_from(parameters[index])
    form = ParameterForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            services.parameter_save(
                workflow_id=workflow.pk, user=request.user, data=form.to_data(), index=index
            )
        except services.WorkflowError as exc:
            if not exc.field_errors:
                form.add_error(None, str(exc))
            _add_service_errors(form, exc)
        else:
            return _editor_response(request, workflow)
    context = {"workflow": workflow, "form": form, "index": index}
    template = (
        "workflows/parameter_form.html#form" if request.htmx else "workflows/parameter_form.html"
    )
    return render(request, template, context)


@require_POST
@capability_required(Capability.AUTHOR_WORKFLOWS)
def parameter_delete(request: AuthenticatedRequest, slug: str, index: int) -> HttpResponse:
    workflow = _workflow(request, slug, author=True)
    try:
        services.parameter_delete(
            workflow_id=workflow.pk,
            user=request.user,
            index=index,
            name=request.POST.get("name", ""),
        )
    except services.WorkflowError as exc:
        return _refused(request, workflow, exc)
    return _editor_response(request, workflow)


@require_POST
@capability_required(Capability.AUTHOR_WORKFLOWS)
def workflow_publish(request: AuthenticatedRequest, slug: str) -> HttpResponse:
    workflow = _workflow(request, slug, author=True)
    try:
        version = services.workflow_publish(
            workflow_id=workflow.pk,
            user=request.user,
            message=request.POST.get("message", ""),
            accept_warnings=request.POST.get("accept_warnings") == "1",
        )
    except services.PublishRefused as exc:
        if exc.problems:
            messages.error(request, "Not published: fix the problems listed under the steps first.")
        else:
            messages.warning(
                request,
                "Not published: read the warnings and tick “publish anyway” if they are intended.",
            )
        return _editor_response(request, workflow)
    except services.WorkflowError as exc:
        messages.error(request, f"Not published: {exc.field_errors.get('message', [str(exc)])[0]}")
        return _editor_response(request, workflow)
    messages.success(request, f"Published version {version.number}.")
    url = reverse("workflows:detail", kwargs={"slug": workflow.slug})
    return HttpResponseClientRedirect(url) if request.htmx else redirect(url)


@require_POST
@capability_required(Capability.AUTHOR_WORKFLOWS)
def workflow_archive(request: AuthenticatedRequest, slug: str) -> HttpResponse:
    workflow = _workflow(request, slug, author=True)
    archived = request.POST.get("archived") == "1"
    services.workflow_set_archived(workflow_id=workflow.pk, user=request.user, archived=archived)
    messages.success(request, f"'{workflow.name}' {'archived' if archived else 'restored'}.")
    return redirect("workflows:detail", slug=workflow.slug)


# Versions ---------------------------------------------------------------------------------------


@require_GET
@capability_required(Capability.VIEW_WORKFLOWS)
def version_detail(request: AuthenticatedRequest, slug: str, number: int) -> HttpResponse:
    workflow = _workflow(request, slug)
    version = selectors.version_get(workflow, number)
    document = version.document or {}
    context = {
        "workflow": workflow,
        "version": version,
        "document": document,
        "steps": selectors.step_views(document.get("steps", [])),
        "parameters": [Parameter.model_validate(p) for p in document.get("parameters", [])],
    }
    return render(request, "workflows/version.html", context)


@require_GET
@capability_required(Capability.VIEW_WORKFLOWS)
def version_export(request: AuthenticatedRequest, slug: str, number: int, fmt: str) -> HttpResponse:
    workflow = _workflow(request, slug)
    version = selectors.version_get(workflow, number)
    _, text = services.version_export(
        version_id=version.pk, user=request.user, fmt="json" if fmt == "json" else "yaml"
    )
    content_type = "application/json" if fmt == "json" else "application/yaml"
    response = HttpResponse(text, content_type=f"{content_type}; charset=utf-8")
    response["Content-Disposition"] = (
        f'attachment; filename="{workflow.slug}-v{version.number}.{fmt}"'
    )
    return response


@require_GET
@capability_required(Capability.VIEW_WORKFLOWS)
def version_diff(request: AuthenticatedRequest, slug: str) -> HttpResponse:
    workflow = _workflow(request, slug)
    versions = list(selectors.published_versions(workflow))
    draft = selectors.draft_of(workflow)
    choices = [(str(v.number), f"v{v.number} — {v.message}") for v in versions]
    if draft is not None:
        choices.insert(0, ("draft", "current draft"))
    default_new = choices[0][0] if choices else ""
    default_old = choices[1][0] if len(choices) > 1 else default_new
    old_key = request.GET.get("from", default_old)
    new_key = request.GET.get("to", default_new)

    def document(key: str) -> dict[str, Any]:
        if key == "draft" and draft is not None:
            return services.draft_canonical_data(workflow, draft)
        if key.isdigit():
            return selectors.version_get(workflow, int(key)).document or {}
        raise Http404("choose two versions")

    entries = document_diff(document(old_key), document(new_key)) if choices else []
    context = {
        "workflow": workflow,
        "choices": choices,
        "old_key": old_key,
        "new_key": new_key,
        "entries": entries,
    }
    return render(request, "workflows/diff.html", context)


# Credentials ------------------------------------------------------------------------------------


@require_GET
@capability_required(Capability.VIEW_WORKFLOWS)
def credential_index(request: AuthenticatedRequest) -> HttpResponse:
    context = {
        "credentials": selectors.credential_list(user=request.user),
        "can_author": _editable(request),
    }
    return render(request, "workflows/credentials.html", context)


@require_http_methods(["GET", "POST"])
@capability_required(Capability.AUTHOR_WORKFLOWS)
def credential_create(request: AuthenticatedRequest) -> HttpResponse:
    form = CredentialForm(request.POST or None)
    offer_team_choice(
        form,
        selectors.authoring_teams(request.user),
        help_text="Only this team's workflows may use it.",
    )
    if request.method == "POST" and form.is_valid():
        try:
            credential = services.credential_create(
                user=request.user,
                team=form.cleaned_data.get("team") or None,
                name=form.cleaned_data["name"],
                kind=form.cleaned_data["kind"],
                description=form.cleaned_data["description"],
                values=form.secret_values(),
            )
        except services.WorkflowError as exc:
            _add_service_errors(form, exc)
        else:
            messages.success(request, f"Credential '{credential.name}' stored encrypted.")
            return redirect("workflows:credentials")
    return render(request, "workflows/credential_form.html", {"form": form, "credential": None})


@require_http_methods(["GET", "POST"])
@capability_required(Capability.AUTHOR_WORKFLOWS)
def credential_replace(request: AuthenticatedRequest, pk: int) -> HttpResponse:
    credential = selectors.credential_get(user=request.user, pk=pk)
    if not user_can(request.user, Capability.AUTHOR_WORKFLOWS, team_id=credential.team_id):
        raise PermissionDenied(f"You may not change {credential.team}'s credentials.")
    form = CredentialValueForm(request.POST or None, kind=credential.kind)
    if request.method == "POST" and form.is_valid():
        try:
            services.credential_replace_value(
                credential_id=credential.pk, user=request.user, values=form.secret_values()
            )
        except services.WorkflowError as exc:
            _add_service_errors(form, exc)
        else:
            messages.success(request, f"The value of '{credential.name}' was replaced.")
            return redirect("workflows:credentials")
    return render(
        request, "workflows/credential_form.html", {"form": form, "credential": credential}
    )
