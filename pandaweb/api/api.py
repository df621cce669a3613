"""The HTTP API under /api/v1/: thin adapters over the same services the dashboard uses.

Every endpoint: authenticate the token (``services.token_authenticate``), check the scope it needs
*before* looking anything up (so a refusal says nothing about whether an object exists), call one
selector or service, render. Errors are RFC 9457 problem documents (``problems.py``).
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI, Router
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.security import HttpBearer

from pandaweb.api import (
    approvals_api,
    audit_api,
    healing_api,
    problems,
    ratelimit,
    runs_api,
    system_api,
    teams_api,
    tokens_api,
    webhooks_api,
)
from pandaweb.api.access import token_with_scope
from pandaweb.api.batch_api import router as batches_router
from pandaweb.api.credentials_api import router as credentials_router
from pandaweb.api.documents import api_url
from pandaweb.api.jsonschema import parameters_schema
from pandaweb.api.parsing import refuse_nul_characters
from pandaweb.api.problems import Problem
from pandaweb.api.schedules_api import router as schedules_router
from pandaweb.api.schemas import WorkflowOut, WorkflowVersionOut
from pandaweb.api.scopes import Scope
from pandaweb.api.services import BEARER_NEEDED, TokenContext, token_authenticate, token_refusal
from pandaweb.api.workflow_api import router as workflow_management
from pandaweb.core.security import with_docs_policy
from workflows import selectors as workflow_selectors
from workflows.fileformat import dump_document
from workflows.models import Workflow, WorkflowVersion
from workflows.schema import WorkflowDocument


class TokenAuth(HttpBearer):
    """``Authorization: Bearer pw_…`` or an OAuth client's ``pwo_…``; then the rate limit of the
    token or the client."""

    openapi_description = (
        "A pandaweb API token (pw_…), made on your profile's token page, or an OAuth client's "
        "access token (pwo_…) from /oauth/token/ (client credentials grant)."
    )

    def authenticate(self, request: HttpRequest, token: str) -> TokenContext | None:
        context = token_authenticate(token)
        if context is None:
            raise _unauthenticated_problem(token_refusal(token))
        verdict = ratelimit.check(
            ratelimit.default_counter(),
            context.principal,
            limit=settings.API_RATE_LIMIT_PER_MINUTE,
        )
        if not verdict.allowed:
            raise Problem(
                429,
                f"this token may make {verdict.limit} requests a minute; "
                f"try again in {verdict.retry_after} s",
                headers={"Retry-After": str(verdict.retry_after)},
            )
        # Audit events written while this request is handled name the token (audit_record).
        request.api_token = context  # type: ignore[attr-defined]
        # Here, before any operation reads its parameters: ninja reports an exception from its
        # body parser as "cannot parse", not as the field at fault.
        refuse_nul_characters(request)
        return context


logger = logging.getLogger(__name__)

api = NinjaAPI(
    title="pandaweb API",
    version="1",
    description=(
        "Launch and follow runs, manage workflows, answer the questions runs ask, decide "
        "approvals and export the "
        "audit trail. Every request carries a token: `Authorization: Bearer pw_…` (an API token) "
        "or `Bearer pwo_…` (an OAuth client's access token from /oauth/token/), with the scope "
        "each operation names. Errors are RFC 9457 problem documents."
    ),
    auth=TokenAuth(),
    urls_namespace="api",
    docs_url="/docs",
    docs_decorator=with_docs_policy,
    openapi_url="/openapi.json",
)


# Problems ----------------------------------------------------------------------------------------


@api.exception_handler(Problem)
def _problem(request: HttpRequest, exc: Problem) -> HttpResponse:
    return problems.render(request, exc)


def _unauthenticated_problem(detail: str) -> Problem:
    return Problem(401, detail, headers={"WWW-Authenticate": 'Bearer realm="pandaweb"'})


@api.exception_handler(AuthenticationError)
def _unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return problems.render(request, _unauthenticated_problem(BEARER_NEEDED))


@api.exception_handler(ValidationError)
def _invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    return problems.render(
        request,
        Problem(422, "the request is not valid", errors=problems.from_validation(exc.errors)),
    )


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return problems.render(request, Problem(404, "no such object, or not yours to see"))


@api.exception_handler(PermissionDenied)
def _forbidden(request: HttpRequest, exc: PermissionDenied) -> HttpResponse:
    return problems.render(request, Problem(403, str(exc) or "not allowed"))


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    return problems.render(request, Problem(exc.status_code, str(exc)))


@api.exception_handler(Exception)
def _unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
    # A client gets a problem document it can act on; what failed goes to the log only (the
    # message of an unexpected error may name internals).
    logger.exception("API request %s %s failed", request.method, request.path)
    return problems.render(
        request,
        Problem(
            500,
            "the server could not handle this request; the error is in its log",
            type="internal-error",
        ),
    )


# Workflows ---------------------------------------------------------------------------------------

workflows = Router(tags=["workflows"])


def _workflow_out(workflow: Workflow) -> WorkflowOut:
    latest = getattr(workflow, "latest_number", None)
    return WorkflowOut(
        slug=workflow.slug,
        name=workflow.name,
        team=workflow.team.slug,
        description=workflow.description,
        latest_version=latest,
        archived=workflow.archived,
        links={"latest": api_url("workflow_version", slug=workflow.slug, number=latest)}
        if latest
        else {},
    )


@workflows.get("/", response=list[WorkflowOut], url_name="workflow_list")
def workflow_list(request: HttpRequest, archived: bool = False) -> list[WorkflowOut]:
    """Workflows of the teams where the token's owner sees workflows, by name."""
    context = token_with_scope(request, Scope.WORKFLOWS_READ)
    listed = workflow_selectors.workflow_list(user=context.user, archived=archived).filter(  # type: ignore[misc]
        published_count__gt=0
    )
    return [_workflow_out(w) for w in listed]


def _published(slug: str, number: int, user: User) -> WorkflowVersion:
    """A published version, 404 also when the workflow is another team's."""
    return workflow_selectors.version_get(workflow_selectors.workflow_get(slug, user=user), number)


@workflows.get(
    "/{slug}/versions/{int:number}", response=WorkflowVersionOut, url_name="workflow_version"
)
def workflow_version(request: HttpRequest, slug: str, number: int) -> WorkflowVersionOut:
    """One published version with its parameters and their JSON Schema (what ``inputs`` takes)."""
    context = token_with_scope(request, Scope.WORKFLOWS_READ)
    version = _published(slug, number, context.user)
    document = version.document or {}
    parameters = list(document.get("parameters", []))
    return WorkflowVersionOut(
        workflow=slug,
        number=number,
        published_at=version.published_at,
        content_hash=version.content_hash,
        message=version.message,
        parameters=parameters,
        inputs_schema=parameters_schema(parameters),
        steps=len(document.get("steps", [])),
        links={"yaml": api_url("workflow_version_yaml", slug=slug, number=number)},
    )


@workflows.get("/{slug}/versions/{int:number}/yaml", url_name="workflow_version_yaml")
def workflow_version_yaml(request: HttpRequest, slug: str, number: int) -> HttpResponse:
    """The version as a workflow file, the same as the dashboard's export."""
    context = token_with_scope(request, Scope.WORKFLOWS_READ)
    version = _published(slug, number, context.user)
    text = dump_document(WorkflowDocument.model_validate(version.document), "yaml")
    response = HttpResponse(text, content_type="application/yaml; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{slug}-v{number}.yaml"'
    return response


api.add_router("/workflows", workflows)
api.add_router("/runs", runs_api.runs)
api.add_router("/runs", healing_api.router)
api.add_router("/questions", runs_api.questions)
api.add_router("/approvals", approvals_api.router)
api.add_router("/audit", audit_api.router)
api.add_router("/workflows", workflow_management)
api.add_router("/webhooks", webhooks_api.router)
api.add_router("/tokens", tokens_api.tokens)
api.add_router("/service-accounts", tokens_api.service_accounts)
api.add_router("/system", system_api.router)
api.add_router("/credentials", credentials_router)
api.add_router("/schedules", schedules_router)
api.add_router("/batches", batches_router)
api.add_router("/teams", teams_api.router)
