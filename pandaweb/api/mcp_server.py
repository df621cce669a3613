"""Published workflows as MCP tools for AI agents (docs/mcp.md).

One low-level ``mcp`` server object serves both transports: streamable HTTP at ``/mcp/`` (see
``mcp_asgi``) and stdio (``manage.py mcp_stdio``). Every request re-authenticates its token with
``token_authenticate``, so a revoked token or a role taken away stops the next call.

The server launches, follows and cancels runs through the same services as the dashboard and the
HTTP API. It has no way to decide an approval: an irreversible step answers "waiting for approval"
with the request's link, and a person decides in the dashboard.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.db.models import QuerySet
from django.urls import reverse
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from approvals.models import ApprovalRequest
from approvals.selectors import question_pending
from pandaweb.api import ratelimit
from pandaweb.api.jsonschema import parameters_schema
from pandaweb.api.parsing import NUL_MESSAGE, nul_fields
from pandaweb.api.scopes import Scope
from pandaweb.api.services import TokenContext, token_authenticate
from pandaweb.audit.context import current_request
from pandaweb.audit.redaction import redact
from pandaweb.core.permissions import in_teams
from pandaweb.core.roles import Capability
from sessions.models import Run, StepResult
from sessions.selectors import runs_visible_to
from sessions.services import RunError, TransitionRefused, run_cancel, run_launch
from workflows.models import Workflow, WorkflowVersion

# How long a tool call waits for its run before answering "still running" (run_status follows).
CALL_WAIT_SECONDS = 120.0
POLL_SECONDS = 1.0
STATUS_TOOL = "run_status"
CANCEL_TOOL = "run_cancel"
_RESOURCE = re.compile(r"^pandaweb://runs/(\d+)/steps/(\d+)/(observation|screenshot)$")

# What an extracted output's kind looks like in the run's outputs. Lenient on purpose: the client
# validates structured content against this, and an output the page did not show is null.
_KIND_SCHEMA: dict[str, dict[str, Any]] = {
    "text": {"type": ["string", "null"]},
    "attribute": {"type": ["string", "null"]},
    "date": {"type": ["string", "null"]},
    "money": {"type": ["string", "number", "null"]},
    "number": {"type": ["number", "string", "null"]},
    "rows": {"type": ["array", "null"]},
}


class ToolRefused(Exception):
    """A call answered with a tool error (isError) in the portal's own words."""


@dataclass
class Caller:
    """Who is calling: the token, the MCP client's name and where to link to."""

    token: TokenContext
    client: str
    session: str
    base_url: str
    remote_addr: str = ""


class _Via:
    """Stands in for the HTTP request in ``current_request`` while a call writes audit events,
    so ``audit_record`` names the token and the MCP client under ``extra.via``."""

    def __init__(self, caller: Caller, request_id: str) -> None:
        self.request_id = request_id
        self.META = {"REMOTE_ADDR": caller.remote_addr}
        self.user = caller.token.user
        self.api_token = self
        self._caller = caller

    @property
    def audit_label(self) -> dict[str, object]:
        token = self._caller.token
        return {**token.audit_label, "channel": "mcp", "client": self._caller.client}


def _page_url(base_url: str, path: str) -> str:
    return base_url.rstrip("/") + path


def _latest_version(workflow: Workflow) -> WorkflowVersion | None:
    return (
        WorkflowVersion.objects.filter(workflow=workflow, published_at__isnull=False)
        .order_by("-number")
        .first()
    )


def output_schema_of(document: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON Schema of a run's outputs, from the outputs its steps declare."""
    properties: dict[str, Any] = {}
    for step in document.get("steps", []):
        if step.get("type") == "extract":
            for extract in step.get("fields", []):
                properties[extract["name"]] = dict(_KIND_SCHEMA.get(extract.get("kind", ""), {}))
        elif step.get("type") in ("download", "screenshot") and step.get("name"):
            properties[step["name"]] = {}
    return {"type": "object", "properties": properties}


def result_schema(outputs: dict[str, Any]) -> dict[str, Any]:
    """Every answer of a workflow tool and of run_status has this shape."""
    return {
        "type": "object",
        "properties": {
            "run_id": {"type": "integer"},
            "status": {"type": "string"},
            "message": {"type": "string"},
            "run_url": {"type": "string"},
            "outputs": outputs,
            "approval": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "url": {"type": "string"},
                    "expires_at": {"type": "string"},
                },
            },
            "failure_reason": {"type": "string"},
        },
        "required": ["run_id", "status", "message", "run_url"],
    }


_RUN_ID_INPUT: dict[str, Any] = {
    "type": "object",
    "properties": {"run_id": {"type": "integer", "minimum": 1}},
    "required": ["run_id"],
    "additionalProperties": False,
}


def _offerable(token: TokenContext) -> QuerySet[Workflow]:
    """The workflows offered as tools to this token: those of the teams where its owner launches
    runs (a tool launches one), so another team's workflow is not even named."""
    return in_teams(
        Workflow.objects.filter(offer_as_tool=True, archived=False),
        token.user,
        Capability.LAUNCH_RUNS,
    )


def _offered(token: TokenContext) -> list[tuple[Workflow, WorkflowVersion]]:
    offered = []
    for workflow in _offerable(token).order_by("slug"):
        version = _latest_version(workflow)
        if version is not None:
            offered.append((workflow, version))
    return offered


def list_tools_for(token: TokenContext) -> list[types.Tool]:
    """The tools this token sees: none without ``tools:call`` (a scope its owner's role allows)."""
    if not token.allows(Scope.TOOLS_CALL):
        return []
    tools = []
    for workflow, version in _offered(token):
        document = version.document or {}
        tools.append(
            types.Tool(
                name=workflow.slug,
                title=workflow.name,
                description=(
                    f"{workflow.name}. {workflow.description}".strip()
                    + " Runs the published pandaweb workflow in its own browser; irreversible "
                    "steps wait for a person's approval."
                ),
                input_schema=parameters_schema(list(document.get("parameters", []))),
                output_schema=result_schema(output_schema_of(document)),
                annotations=types.ToolAnnotations(read_only_hint=False, open_world_hint=True),
            )
        )
    generic = result_schema({"type": "object"})
    tools.append(
        types.Tool(
            name=STATUS_TOOL,
            description="The status of a run this token launched: outputs when it finished, the "
            "approval request's link while it waits for a person.",
            input_schema=_RUN_ID_INPUT,
            output_schema=generic,
            annotations=types.ToolAnnotations(read_only_hint=True),
        )
    )
    tools.append(
        types.Tool(
            name=CANCEL_TOOL,
            description="Stop a run this token's owner launched.",
            input_schema=_RUN_ID_INPUT,
            output_schema=generic,
            annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=True),
        )
    )
    return tools


def _own_run(token: TokenContext, run_id: Any) -> Run:
    """The owner's run, in a team where they may still see runs; anyone else's answers exactly
    as a missing one does."""
    run = (
        runs_visible_to(token.user)
        .select_related("workflow")
        .filter(pk=run_id if isinstance(run_id, int) else -1, launched_by=token.user)
        .first()
    )
    if run is None:
        raise ToolRefused(f"There is no run #{run_id}.")
    return run


def describe(run: Run, base_url: str) -> tuple[dict[str, Any], bool]:
    """The answer for ``run`` as it stands: structured content, and whether it is a tool error."""
    run_url = _page_url(base_url, reverse("runs:detail", kwargs={"run_id": run.pk}))
    answer: dict[str, Any] = {"run_id": run.pk, "status": run.status, "run_url": run_url}
    if run.status == Run.Status.SUCCEEDED:
        # Outputs are what the page showed; a field named like a secret is still never handed out.
        answer["outputs"] = redact(dict(run.outputs or {}))
        answer["message"] = f"Run #{run.pk} finished."
        return answer, False
    if run.status == Run.Status.AWAITING_ANSWER:
        question = question_pending(run)
        answer["message"] = (
            "waiting for a person to answer on the run page (the answer never passes through "
            "this tool); follow the run with run_status"
        )
        if question is not None:
            answer["question"] = {
                "text": question.text,
                "kind": question.kind,
                "expires_at": question.expires_at.isoformat(),
            }
        return answer, False
    if run.status == Run.Status.AWAITING_APPROVAL:
        approval = (
            ApprovalRequest.objects.filter(run=run, status=ApprovalRequest.Status.PENDING)
            .order_by("-created_at")
            .first()
        )
        answer["message"] = (
            "waiting for approval: a reviewer decides in the pandaweb dashboard; follow the run "
            "with run_status"
        )
        if approval is not None:
            answer["approval"] = {
                "id": approval.pk,
                "url": _page_url(
                    base_url, reverse("approvals:detail", kwargs={"approval_id": approval.pk})
                ),
                "expires_at": approval.expires_at.isoformat() if approval.expires_at else "",
            }
        return answer, False
    if run.status in Run.FINAL:
        reason = run.failure_reason or run.get_status_display()
        answer["failure_reason"] = reason
        answer["message"] = f"Run #{run.pk} {run.get_status_display().lower()}: {reason}"
        return answer, True
    if run.status == Run.Status.NEEDS_RECONCILIATION:
        answer["message"] = (
            f"Run #{run.pk} needs reconciliation: a person checks the portal and records "
            "whether its irreversible step happened."
        )
        return answer, False
    answer["message"] = f"Run #{run.pk} is still running; follow it with run_status."
    return answer, False


def _call_key(caller: Caller, request_id: Any, name: str, arguments: Mapping[str, Any]) -> str:
    """The idempotency key of a call: the same request of the same session launches once."""
    canonical = json.dumps(
        [caller.session, str(request_id), name, arguments], sort_keys=True, default=str
    )
    return "mcp:" + hashlib.sha256(canonical.encode()).hexdigest()[:60]


def launch_for(
    caller: Caller, name: str, arguments: Mapping[str, Any], request_id: Any
) -> tuple[int, int]:
    """Launch the offered workflow ``name``; returns (run id, its step count)."""
    if not caller.token.allows(Scope.TOOLS_CALL):
        raise ToolRefused(f"Unknown tool {name!r}.")
    workflow = _offerable(caller.token).filter(slug=name).first()
    version = _latest_version(workflow) if workflow is not None else None
    if workflow is None or version is None:
        raise ToolRefused(f"Unknown tool {name!r}.")
    reset = current_request.set(_Via(caller, str(request_id)))  # type: ignore[arg-type]
    try:
        run = run_launch(
            workflow_id=workflow.pk,
            user=caller.token.user,
            raw_inputs=dict(arguments),
            idempotency_key=_call_key(caller, request_id, name, arguments),
        )
    except RunError as exc:
        if exc.field_errors:
            lines = [f"{field}: {' '.join(msgs)}" for field, msgs in exc.field_errors.items()]
            raise ToolRefused("The inputs are not valid.\n" + "\n".join(lines)) from None
        raise ToolRefused(str(exc)) from None
    finally:
        current_request.reset(reset)
    return run.pk, len((version.document or {}).get("steps", []))


def cancel_for(caller: Caller, run_id: Any, request_id: Any) -> Run:
    run = _own_run(caller.token, run_id)
    reset = current_request.set(_Via(caller, str(request_id)))  # type: ignore[arg-type]
    try:
        run_cancel(run_id=run.pk, user=caller.token.user)
    except TransitionRefused as exc:
        raise ToolRefused(str(exc)) from None
    finally:
        current_request.reset(reset)
    return Run.objects.select_related("workflow").get(pk=run.pk)


def _progress(run_id: int, reported: int) -> tuple[Run, list[str]]:
    """The run, then the sentences of its steps recorded after the first ``reported``: several
    steps may finish between two polls, and each gets its own notification."""
    run = Run.objects.select_related("workflow").get(pk=run_id)
    steps = StepResult.objects.filter(run_id=run_id).order_by("index", "pk")
    return run, list(steps.values_list("sentence", flat=True)[reported:])


def read_resource_for(
    token: TokenContext, uri: str
) -> types.TextResourceContents | types.BlobResourceContents:
    """A step's observation (text) or screenshot (PNG), for whoever may see the run: its
    launcher with ``tools:call``, or a token with ``runs:read``."""
    match = _RESOURCE.match(uri)
    if match is None:
        raise ToolRefused(f"Unknown resource {uri!r}.")
    run_id, index, kind = int(match[1]), int(match[2]), match[3]
    runs = runs_visible_to(token.user)
    if not token.allows(Scope.RUNS_READ):
        if not token.allows(Scope.TOOLS_CALL):
            raise ToolRefused(f"Unknown resource {uri!r}.")
        runs = runs.filter(launched_by=token.user)
    step = StepResult.objects.filter(run__in=runs, run_id=run_id, index=index).first()
    if step is None:
        raise ToolRefused(f"Unknown resource {uri!r}.")
    if kind == "observation":
        text = json.dumps(redact(step.observation), indent=1, default=str)
        return types.TextResourceContents(uri=uri, mime_type="application/json", text=text)
    root = (Path(settings.RUN_FILES_DIR) / str(run_id)).resolve()
    target = (root / step.screenshot).resolve() if step.screenshot else root
    if not step.screenshot or not target.is_relative_to(root) or not target.is_file():
        raise ToolRefused(f"Unknown resource {uri!r}.")
    blob = base64.b64encode(target.read_bytes()).decode()
    return types.BlobResourceContents(uri=uri, mime_type="image/png", blob=blob)


def _origin_of(request: Any) -> str:
    """The dashboard origin the client reached us on, when it is one of ours (links then work
    for that client); else empty, and the first public origin is used."""
    url = getattr(request, "url", None)
    if url is None:
        return ""
    for scheme in (url.scheme, "https"):
        origin = f"{scheme}://{url.netloc}"
        if origin in settings.PUBLIC_ORIGINS:
            return origin
    return ""


def _text_result(answer: dict[str, Any], is_error: bool) -> types.CallToolResult:
    text = answer["message"]
    if answer.get("approval"):
        approval = answer["approval"]
        text += f"\nApproval request: {approval['url']} (expires {approval['expires_at']})"
    if answer.get("outputs") is not None:
        text += "\nOutputs: " + json.dumps(answer["outputs"], default=str)
    text += f"\nRun page: {answer['run_url']}"
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=None if is_error else answer,
        is_error=is_error,
    )


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)], is_error=True
    )


async def _count_call(token: TokenContext) -> None:
    """Count a call against the rate limit of the token (or its OAuth client); refuse it past
    the limit."""
    verdict = await database_sync_to_async(ratelimit.check)(
        ratelimit.default_counter(),
        token.principal,
        limit=settings.API_RATE_LIMIT_PER_MINUTE,
    )
    if not verdict.allowed:
        raise MCPError(
            -32002,
            f"this token may make {verdict.limit} requests a minute; "
            f"try again in {verdict.retry_after} s",
        )


async def _run_tool(
    caller: Caller, name: str, arguments: dict[str, Any], request_id: Any
) -> types.CallToolResult:
    """``run_status`` or ``run_cancel``: the run's state in words."""
    if not caller.token.allows(Scope.TOOLS_CALL):
        raise ToolRefused(f"Unknown tool {name!r}.")
    if name == CANCEL_TOOL:
        run = await database_sync_to_async(cancel_for)(caller, arguments.get("run_id"), request_id)
    else:
        run = await database_sync_to_async(_own_run)(caller.token, arguments.get("run_id"))
    answer, _ = await database_sync_to_async(describe)(run, caller.base_url)
    # The question was answered, even when the run failed: no tool error.
    return _text_result(answer, False)


def build_server(
    raw_token_of: Callable[[ServerRequestContext[Any, Any]], str | None],
    *,
    base_url: str,
    session_of: Callable[[ServerRequestContext[Any, Any]], str],
    wait_seconds: float = CALL_WAIT_SECONDS,
) -> Server[Any]:
    """The MCP server. ``raw_token_of`` finds the caller's token secret in a request's context
    (the HTTP ``Authorization`` header, or the stdio command's ``--token``).

    Its handlers run outside Django's request cycle, so each database call goes through
    ``database_sync_to_async``, which does that cycle's part: the connection goes back after the
    call and the next call gets a checked one. Plain ``sync_to_async`` would keep one connection
    on its thread for good: once the server closed it, every call would fail until a restart.
    """

    async def caller_of(ctx: ServerRequestContext[Any, Any], *, count: bool) -> Caller:
        raw = raw_token_of(ctx) or ""
        token = await database_sync_to_async(token_authenticate)(raw)
        if token is None:
            raise MCPError(-32001, "The token is unknown, revoked or expired.")
        if count:
            await _count_call(token)
        params = ctx.session.client_params
        client = params.client_info.name if params is not None else "unknown"
        remote = ""
        request = ctx.request
        if request is not None and getattr(request, "client", None) is not None:
            remote = request.client.host
        return Caller(
            token=token,
            client=client[:100],
            session=session_of(ctx),
            base_url=_origin_of(request) or base_url,
            remote_addr=remote,
        )

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        caller = await caller_of(ctx, count=False)
        tools = await database_sync_to_async(list_tools_for)(caller.token)
        return types.ListToolsResult(tools=tools)

    async def follow(
        ctx: ServerRequestContext[Any, Any], caller: Caller, run_id: int, total: int
    ) -> types.CallToolResult:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        reported = 0
        while True:
            run, sentences = await database_sync_to_async(_progress)(run_id, reported)
            for sentence in sentences:
                reported += 1
                await ctx.session.report_progress(
                    reported, float(total) if total else None, sentence[:200] or None
                )
            if run.status not in (Run.Status.QUEUED, *Run.ACTIVE) or (
                run.status in Run.WAITING_FOR_PEOPLE
            ):
                break
            if loop.time() >= deadline:
                break
            await asyncio.sleep(POLL_SECONDS)
        answer, is_error = await database_sync_to_async(describe)(run, caller.base_url)
        return _text_result(answer, is_error)

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        caller = await caller_of(ctx, count=True)
        arguments = dict(params.arguments or {})
        try:
            if fields := nul_fields(arguments):
                raise ToolRefused(f"{NUL_MESSAGE} Found in: {', '.join(fields)}.")
            if params.name in (STATUS_TOOL, CANCEL_TOOL):
                return await _run_tool(caller, params.name, arguments, ctx.request_id)
            run_id, total = await database_sync_to_async(launch_for)(
                caller, params.name, arguments, ctx.request_id
            )
        except ToolRefused as exc:
            return _error(str(exc))
        return await follow(ctx, caller, run_id, total)

    async def list_resource_templates(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        await caller_of(ctx, count=False)
        base = "pandaweb://runs/{run_id}/steps/{index}/"
        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate(
                    name="step-observation",
                    uri_template=base + "observation",
                    description="What the robot read on the page around a step (0-based index).",
                    mime_type="application/json",
                ),
                types.ResourceTemplate(
                    name="step-screenshot",
                    uri_template=base + "screenshot",
                    description="The screenshot taken after a step.",
                    mime_type="image/png",
                ),
            ]
        )

    async def read_resource(
        ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        caller = await caller_of(ctx, count=True)
        try:
            contents = await database_sync_to_async(read_resource_for)(
                caller.token, str(params.uri)
            )
        except ToolRefused as exc:
            raise MCPError(-32002, str(exc)) from None
        return types.ReadResourceResult(contents=[contents])

    return Server(
        "pandaweb",
        version="1",
        instructions=(
            "Each tool runs a published pandaweb workflow. Irreversible steps wait for a person's "
            "approval in the dashboard; no tool approves. Follow long runs with run_status."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resource_templates=list_resource_templates,
        on_read_resource=read_resource,
    )


def new_session_id() -> str:
    return uuid.uuid4().hex
