"""Managing workflows over the API: import a file, the draft, settings, publishing, versions and
their differences, the session template. Each endpoint calls the service the workflow editor's
view calls, with the capability that view requires (through the token's scope), so a workflow
changed here is the same as one changed on the dashboard, audit events included.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest
from django.urls import reverse
from ninja import Query, Router, Status

from pandaweb.api.access import token_with_scope
from pandaweb.api.idempotency import idempotency_key_header, key_reused
from pandaweb.api.problems import Problem, field_errors
from pandaweb.api.schemas import (
    DiffEntryOut,
    DiffOut,
    DocumentProblemOut,
    DraftOut,
    FieldChangeOut,
    PublishIn,
    SessionTemplateOut,
    VersionSummary,
    WorkflowDetailOut,
    WorkflowSettingsIn,
)
from pandaweb.api.scopes import Scope
from sessions import selectors as session_selectors
from sessions.services import TemplateError, template_request_bake
from workflows import selectors, services
from workflows.diff import document_diff
from workflows.fileformat import MAX_FILE_BYTES, LocatedProblem
from workflows.models import Credential, Workflow, WorkflowVersion
from workflows.schema import APPROVAL_REACH_OPTIONS
from workflows.services.drafts import settings_of

router = Router(tags=["workflows"])

INVALID = "the request is not valid"


def _url(name: str, **kwargs: Any) -> str:
    return reverse(f"api:{name}", kwargs=kwargs)


def _document_problems(located: list[LocatedProblem]) -> list[DocumentProblemOut]:
    return [
        DocumentProblemOut(
            field=".".join(str(part) for part in p.path) or p.where,
            where=p.where,
            message=p.message,
            line=p.line,
        )
        for p in located
    ]


def _detail(workflow: Workflow) -> WorkflowDetailOut:
    latest = selectors.published_versions(workflow).first()
    number = latest.number if latest is not None else None
    links = {
        "self": _url("workflow_get", slug=workflow.slug),
        "draft": _url("workflow_draft", slug=workflow.slug),
        "versions": _url("workflow_versions", slug=workflow.slug),
        "session_template": _url("session_template_get", slug=workflow.slug),
    }
    if number is not None:
        links["latest"] = _url("workflow_version", slug=workflow.slug, number=number)
    return WorkflowDetailOut(
        slug=workflow.slug,
        name=workflow.name,
        team=workflow.team.slug,
        description=workflow.description,
        latest_version=number,
        archived=workflow.archived,
        reviewer_group=workflow.reviewer_group.name,
        settings=settings_of(workflow),
        offer_as_tool=workflow.offer_as_tool,
        has_draft=selectors.draft_of(workflow) is not None,
        links=links,
    )


def draft_out(workflow: Workflow, draft: WorkflowVersion) -> DraftOut:
    review = services.draft_review(workflow, draft)
    return DraftOut(
        workflow=workflow.slug,
        created_at=draft.created_at,
        updated_at=draft.updated_at,
        document=services.draft_canonical_data(workflow, draft),
        problems=_document_problems(review.located_problems),
        warnings=_document_problems(review.located_warnings),
        links={
            "publish": _url("workflow_publish", slug=workflow.slug),
            "diff": _url("workflow_diff", slug=workflow.slug),
        },
    )


def workflow_refusal(
    exc: services.WorkflowError, *, fields: dict[str, str] | None = None
) -> Problem:
    """A refused change: 422 naming the request's fields when the service named any (by the
    dashboard form's field names, ``fields`` maps those the API calls otherwise), 409 when the
    workflow's state refused it (archived, no draft), 403 when it is another team's to change."""
    if isinstance(exc, services.NotYourTeam):
        return Problem(403, str(exc), type="workflow-refused")
    if not exc.field_errors:
        return Problem(409, str(exc), type="workflow-refused")
    named = {
        (fields or {}).get(name, name): messages for name, messages in exc.field_errors.items()
    }
    return Problem(422, INVALID, errors=field_errors(named))


# Import ------------------------------------------------------------------------------------------


@router.post(
    "/import",
    response={200: WorkflowDetailOut, 201: WorkflowDetailOut},
    url_name="workflow_import",
    summary="Import a workflow file as a draft",
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "A workflow file, as the dashboard exports it (YAML or JSON).",
            "content": {
                "application/yaml": {"schema": {"type": "string"}},
                "application/json": {"schema": {"type": "object"}},
            },
        }
    },
)
def workflow_import(
    request: HttpRequest,
    team: str | None = Query(
        None,
        description="The slug of the team a new workflow joins; needed only by someone who "
        "writes workflows in several teams. A new draft of an existing workflow stays in its "
        "team.",
    ),
) -> Status[WorkflowDetailOut]:
    """The file becomes the draft of the workflow with its slug (a new workflow when there is
    none, in the team ``team`` or the token owner's only team), all or nothing: 201. 200 when
    the file is the latest published version already and there is no draft (nothing is made);
    importing the same file again is safe. Credentials the file names must be the workflow's
    team's.

    A refused file is a 422 whose ``errors`` name each problem's path in the document, its line
    in the file and the place in people's words. Scope: ``workflows:write``."""
    context = token_with_scope(request, Scope.WORKFLOWS_WRITE)
    try:
        text = request.body
    except RequestDataTooBig:
        message = f"the file is larger than {MAX_FILE_BYTES // 1000} kB"
        raise Problem(
            422, "the file was not imported", errors=[{"field": "file", "message": message}]
        ) from None
    try:
        workflow = services.workflow_import(user=context.user, text=text, team=team)
    except services.ImportUnchanged as exc:
        return Status(200, _detail(selectors.workflow_get(exc.workflow.slug, user=context.user)))
    except services.ImportRefused as exc:
        errors = [p.model_dump() for p in _document_problems(exc.problems)]
        raise Problem(422, "the file was not imported", errors=errors) from None
    except services.WorkflowError as exc:
        raise workflow_refusal(exc) from None
    return Status(201, _detail(selectors.workflow_get(workflow.slug, user=context.user)))


# The workflow and its draft -----------------------------------------------------------------------


@router.get(
    "/{slug}", response=WorkflowDetailOut, url_name="workflow_get", summary="Get a workflow"
)
def workflow_get(request: HttpRequest, slug: str) -> WorkflowDetailOut:
    """The workflow with the settings its next version carries. Scope: ``workflows:read``."""
    context = token_with_scope(request, Scope.WORKFLOWS_READ)
    return _detail(selectors.workflow_get(slug, user=context.user))


@router.get("/{slug}/draft", response=DraftOut, url_name="workflow_draft", summary="Get the draft")
def draft_get(request: HttpRequest, slug: str) -> DraftOut:
    """The draft as it would be published, with what stands in the way (problems) and what needs
    accepting (warnings); 404 when there is none. Scope: ``workflows:read``."""
    context = token_with_scope(request, Scope.WORKFLOWS_READ)
    workflow = selectors.workflow_get(slug, user=context.user)
    draft = selectors.draft_of(workflow)
    if draft is None:
        raise Http404("no draft")
    return draft_out(workflow, draft)


@router.post(
    "/{slug}/draft",
    response={200: DraftOut, 201: DraftOut},
    url_name="workflow_draft_start",
    summary="Start a draft",
)
def draft_start(request: HttpRequest, slug: str) -> Status[DraftOut]:
    """A draft started from the latest published version (201), or the draft there is (200).
    Scope: ``workflows:write``."""
    context = token_with_scope(request, Scope.WORKFLOWS_WRITE)
    workflow = selectors.workflow_get(slug, user=context.user)
    try:
        draft, created = services.workflow_start_draft(workflow_id=workflow.pk, user=context.user)
    except services.WorkflowError as exc:
        raise workflow_refusal(exc) from None
    return Status(201 if created else 200, draft_out(workflow, draft))


# The settings form's fields the API names otherwise: the approval reach and recording options
# travel as the objects the file format has.
_REACH_FIELDS = {
    "approval_slack_channel": "approval_reach.slack_channel",
    "approval_passkey": "approval_reach.passkey",
    "approval_passkey_above_amount": "approval_reach.passkey_above_amount",
    "approval_fact_amount": "approval_reach.facts.amount",
    "approval_fact_currency": "approval_reach.facts.currency",
    "approval_fact_payee": "approval_reach.facts.payee",
    "approval_fact_reference": "approval_reach.facts.reference",
    "filmstrip": "recording.filmstrip",
    "filmstrip_seconds_per_frame": "recording.filmstrip_seconds_per_frame",
    "filmstrip_max_mb": "recording.filmstrip_max_mb",
    "__all__": "",
}


def _group(name: str, field: str) -> Group:
    group = Group.objects.filter(name=name).first()
    if group is None:
        raise Problem(
            422, INVALID, errors=[{"field": field, "message": f"there is no group named {name!r}"}]
        )
    return group


def _credentials(names: list[str]) -> list[Credential]:
    found = {c.name: c for c in Credential.objects.filter(name__in=names)}
    missing = [n for n in names if n not in found]
    if missing:
        errors = [
            {"field": "credentials", "message": f"no credential is named {n!r}"} for n in missing
        ]
        raise Problem(422, INVALID, errors=errors)
    return [found[n] for n in names]


@router.patch(
    "/{slug}/settings",
    response=WorkflowDetailOut,
    url_name="workflow_settings",
    summary="Change settings",
)
def settings_update(
    request: HttpRequest, slug: str, payload: WorkflowSettingsIn
) -> WorkflowDetailOut:
    """Change the settings the next version carries, the fields sent only (the settings form's
    service): a change goes into the draft (started when there is none); runs keep the latest
    published version's settings until the draft is published. Sending the values there are
    changes nothing. Scope: ``workflows:write``."""
    context = token_with_scope(request, Scope.WORKFLOWS_WRITE)
    workflow = selectors.workflow_get(slug, user=context.user)
    sent = payload.model_dump(exclude_unset=True)
    nulls = [name for name, value in sent.items() if value is None and name not in _MAY_BE_NULL]
    if nulls:
        raise Problem(
            422,
            "the request is not valid",
            errors=[
                {"field": name, "message": "may not be null: leave it out to keep its value"}
                for name in nulls
            ],
        )
    # The policy's other options have fields of their own, checked as the form checks them.
    stray = set(sent.get("approval_reach") or {}) - set(APPROVAL_REACH_OPTIONS)
    if stray:
        raise Problem(
            422,
            "the request is not valid",
            errors=[
                {
                    "field": f"approval_reach.{name}",
                    "message": f"not an option of approval_reach (those are: "
                    f"{', '.join(APPROVAL_REACH_OPTIONS)}); send it as its own field",
                }
                for name in sorted(stray)
            ],
        )
    escalation = sent.get("approval_escalation_group", workflow.approval_escalation_group)
    if escalation:
        _group(escalation, "approval_escalation_group")
    try:
        services.workflow_update_settings(
            workflow_id=workflow.pk,
            user=context.user,
            name=sent.get("name", workflow.name),
            description=sent.get("description", workflow.description),
            reviewer_group=_group(sent["reviewer_group"], "reviewer_group")
            if "reviewer_group" in sent
            else workflow.reviewer_group,
            allowed_hosts=sent.get("allowed_hosts", workflow.allowed_hosts),
            step_budget=sent.get("step_budget", workflow.step_budget),
            run_ttl_minutes=sent.get("run_ttl_minutes", workflow.run_ttl_minutes),
            max_concurrent_runs=sent.get("max_concurrent_runs", workflow.max_concurrent_runs),
            approval_quorum=sent.get("approval_quorum", workflow.approval_quorum),
            approval_expiry_minutes=sent.get(
                "approval_expiry_minutes", workflow.approval_expiry_minutes
            ),
            author_may_approve=sent.get("author_may_approve", workflow.author_may_approve),
            credentials=_credentials(sent["credentials"])
            if "credentials" in sent
            else list(workflow.credentials.all()),
            approval_remind_before_minutes=sent.get(
                "approval_remind_before_minutes", workflow.approval_remind_before_minutes
            ),
            approval_escalate_after_minutes=sent.get(
                "approval_escalate_after_minutes", workflow.approval_escalate_after_minutes
            ),
            approval_escalation_group=escalation,
            approval_reach={**workflow.approval_reach, **sent["approval_reach"]}
            if sent.get("approval_reach") is not None
            else None,
            recording={**workflow.recording, **sent["recording"]}
            if sent.get("recording") is not None
            else None,
            offer_as_tool=sent.get("offer_as_tool"),
        )
    except services.WorkflowError as exc:
        raise workflow_refusal(exc, fields=_REACH_FIELDS) from None
    return _detail(selectors.workflow_get(slug, user=context.user))


# The settings whose null means "as they are" (the options objects and offering as a tool).
_MAY_BE_NULL = frozenset({"approval_reach", "recording", "offer_as_tool"})


# Archiving and restoring --------------------------------------------------------------------------


def _set_archived(request: HttpRequest, slug: str, *, archived: bool) -> WorkflowDetailOut:
    context = token_with_scope(request, Scope.WORKFLOWS_WRITE)
    workflow = selectors.workflow_get(slug, user=context.user)
    try:
        services.workflow_set_archived(
            workflow_id=workflow.pk, user=context.user, archived=archived
        )
    except services.WorkflowError as exc:
        raise workflow_refusal(exc) from None
    return _detail(selectors.workflow_get(slug, user=context.user))


@router.post(
    "/{slug}/archive",
    response=WorkflowDetailOut,
    url_name="workflow_archive",
    summary="Archive a workflow",
)
def archive(request: HttpRequest, slug: str) -> WorkflowDetailOut:
    """Archive the workflow, as the workflow page's Archive button: it leaves the list
    (``GET /workflows/?archived=true`` shows it), nothing launches it (a launch, a batch or a
    schedule's launch is refused with 409, and it is no MCP tool), and its draft and settings are
    frozen until it is restored. Its versions and runs stay. Idempotent: archiving an archived
    workflow changes nothing. 403 for a token whose owner sees the workflow but does not write
    its team's workflows. Scope: ``workflows:write``."""
    return _set_archived(request, slug, archived=True)


@router.post(
    "/{slug}/restore",
    response=WorkflowDetailOut,
    url_name="workflow_restore",
    summary="Restore an archived workflow",
)
def restore(request: HttpRequest, slug: str) -> WorkflowDetailOut:
    """Bring an archived workflow back, as the workflow page's Restore button: it is listed,
    launched and edited again. Idempotent: restoring a workflow that is not archived changes
    nothing. Scope: ``workflows:write``."""
    return _set_archived(request, slug, archived=False)


# Publishing and versions --------------------------------------------------------------------------


@router.post(
    "/{slug}/publish",
    response={200: VersionSummary, 201: VersionSummary},
    url_name="workflow_publish",
    summary="Publish the draft",
)
def publish(
    request: HttpRequest,
    slug: str,
    payload: PublishIn,
    idempotency_key: str = idempotency_key_header("the version published", same="message"),
) -> Status[VersionSummary]:
    """Turn the draft into the next numbered version (201), as the editor's Publish button.

    Refused with 422 ``publish-refused`` while the draft has problems (``errors``: each with its
    path in the document), and with 409 ``warnings-not-accepted`` while it has warnings and
    ``accept_warnings`` is not true (``warnings``: the same shape). 409 when there is no draft.
    Scope: ``workflows:write``."""
    context = token_with_scope(request, Scope.WORKFLOWS_WRITE)
    workflow = selectors.workflow_get(slug, user=context.user)
    try:
        version, created = services.workflow_publish_once(
            workflow_id=workflow.pk,
            user=context.user,
            message=payload.message,
            accept_warnings=payload.accept_warnings,
            idempotency_key=idempotency_key,
        )
    except services.PublishKeyReused as exc:
        raise key_reused(exc) from None
    except services.PublishRefused as exc:
        located = _document_problems(exc.review.located_problems)
        warned = [w.model_dump() for w in _document_problems(exc.review.located_warnings)]
        if located:
            raise Problem(
                422,
                "the draft cannot be published: fix its problems first",
                type="publish-refused",
                errors=[p.model_dump() for p in located],
                warnings=warned,
            ) from None
        raise Problem(
            409,
            "the draft has warnings: read them, and publish with accept_warnings if they are "
            "intended",
            type="warnings-not-accepted",
            warnings=warned,
        ) from None
    except services.WorkflowError as exc:
        raise workflow_refusal(exc) from None
    return Status(201 if created else 200, _version_summary(version))


def _version_summary(version: WorkflowVersion) -> VersionSummary:
    assert version.number is not None
    return VersionSummary(
        number=version.number,
        published_at=version.published_at,
        author=version.author.get_username() if version.author else None,
        message=version.message,
        content_hash=version.content_hash,
        links={"self": _url("workflow_version", slug=version.workflow.slug, number=version.number)},
    )


@router.get(
    "/{slug}/versions",
    response=list[VersionSummary],
    url_name="workflow_versions",
    summary="List published versions",
)
def versions(request: HttpRequest, slug: str) -> list[VersionSummary]:
    """The published versions, newest first. Scope: ``workflows:read``."""
    context = token_with_scope(request, Scope.WORKFLOWS_READ)
    workflow = selectors.workflow_get(slug, user=context.user)
    return [_version_summary(v) for v in selectors.published_versions(workflow)]


@router.get(
    "/{slug}/diff", response=DiffOut, url_name="workflow_diff", summary="Compare two versions"
)
def diff(
    request: HttpRequest,
    slug: str,
    old: str = Query(..., alias="from", description="A version number, or 'draft'."),
    new: str = Query("draft", alias="to", description="A version number, or 'draft'."),
) -> DiffOut:
    """What changed between two versions (or a version and the draft), field by field: the
    version page's comparison. Scope: ``workflows:read``."""
    context = token_with_scope(request, Scope.WORKFLOWS_READ)
    workflow = selectors.workflow_get(slug, user=context.user)

    def document(key: str, field: str) -> dict[str, Any]:
        if key == "draft":
            draft = selectors.draft_of(workflow)
            if draft is not None:
                return services.draft_canonical_data(workflow, draft)
            message = "there is no draft"
        else:
            try:
                return selectors.version_get(workflow, int(key)).document or {}
            except (ValueError, Http404):
                message = f"no version {key!r}: a published version's number, or 'draft'"
        raise Problem(422, INVALID, errors=[{"field": field, "message": message}])

    entries = document_diff(document(old, "from"), document(new, "to"))
    return DiffOut(
        workflow=slug,
        old=old,
        new=new,
        entries=[
            DiffEntryOut(
                section=e.section,
                kind=e.kind,
                label=e.label,
                changes=[FieldChangeOut(path=c.path, old=c.old, new=c.new) for c in e.changes],
                note=e.note,
            )
            for e in entries
        ],
    )


# The session template -----------------------------------------------------------------------------


def _session_template_out(workflow: Workflow) -> SessionTemplateOut:
    panel = session_selectors.session_template_panel(workflow, backend=settings.SANDBOX_BACKEND)
    if panel is None:
        raise Http404("the latest published version has no session template")
    template = panel.template
    assert panel.version.number is not None
    found: dict[str, Any] = {"status": "never baked", "template": None, "requested_by": None}
    if template is not None:
        found = {
            "status": template.status,
            "template": template.pk,
            "requested_by": template.requested_by.get_username() if template.requested_by else None,
            "baked_at": template.baked_at,
            "failure_reason": template.failure_reason,
            "stale_reason": template.stale_reason,
        }
    return SessionTemplateOut(
        workflow=workflow.slug,
        version=panel.version.number,
        backend=panel.backend,
        rebake_due_at=panel.rebake_due_at,
        rebake_every_hours=panel.session.rebake_every_hours,
        links={"bake": _url("session_template_bake", slug=workflow.slug)},
        **{"baked_at": None, "failure_reason": "", "stale_reason": "", **found},
    )


@router.get(
    "/{slug}/session-template",
    response=SessionTemplateOut,
    url_name="session_template_get",
    summary="Session template status",
)
def session_template(request: HttpRequest, slug: str) -> SessionTemplateOut:
    """The session template runs of the latest published version fork: ready, baking, stale (a
    run found it logged out) or failed, which fails runs until it is re-baked; 404 when the
    version logs in no session. Scope: ``workflows:read``."""
    context = token_with_scope(request, Scope.WORKFLOWS_READ)
    return _session_template_out(selectors.workflow_get(slug, user=context.user))


@router.post(
    "/{slug}/session-template/bake",
    response={202: SessionTemplateOut},
    url_name="session_template_bake",
    summary="Re-bake the session template",
)
def session_template_bake(request: HttpRequest, slug: str) -> Status[SessionTemplateOut]:
    """Log in again for the latest published version, as the workflow page's Re-bake button: the
    bake is queued (202) and runs fork it once it is ``ready``. Idempotent while a bake is under
    way: that one is returned. Scope: ``session-templates:bake``."""
    context = token_with_scope(request, Scope.SESSION_TEMPLATES_BAKE)
    workflow = selectors.workflow_get(slug, user=context.user)
    version = selectors.published_versions(workflow).first()
    if version is None:
        raise Problem(409, "publish a version of this workflow first", type="bake-refused")
    try:
        template_request_bake(
            version_id=version.pk, user=context.user, backend=settings.SANDBOX_BACKEND
        )
    except TemplateError as exc:
        raise Problem(409, f"nothing was baked: {exc}", type="bake-refused") from None
    return Status(202, _session_template_out(workflow))
