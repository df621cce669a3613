"""Published workflows as MCP tools on the real stack, through the SDK's own client: an agent lists
the tools, downloads invoices, pays one (a reviewer approves in between, never the agent) and
follows the run with run_status; other tokens see nothing or are refused."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from pandaweb.demo_portal.state import PortalState
from tests.e2e.conftest import Stack
from tests.e2e.test_api import api

T = TypeVar("T")

pytestmark = [pytest.mark.e2e]


def in_own_loop(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run the SDK's client on a loop of its own thread: the suite's sync Playwright keeps an
    event loop running on this one, where asyncio.run() is refused."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def agent(stack: Stack, token: str, work: Any) -> Any:
    """Run ``work(session)`` in an initialized MCP session named "test-agent"."""
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with client, streamable_http_client(f"{stack.url}/mcp/", http_client=client) as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(
            read, write, client_info=types.Implementation(name="test-agent", version="1")
        ) as session:
            await session.initialize()
            return await work(session)


def test_an_agent_runs_published_workflows_through_mcp_and_a_person_approves(
    stack: Stack,
) -> None:
    stack.manage("demo_workflow")
    stack.manage(
        "shell", "-c",
        "from workflows.models import Workflow; "
        "Workflow.objects.filter(slug__in=['acme-download-invoices', 'acme-pay-invoice'])"
        ".update(offer_as_tool=True)",
    )  # fmt: skip
    agent_token = stack.manage(
        "api_token", "olivia.operator", "--name", "agent",
        "--scope", "tools:call", "--scope", "workflows:read",
    ).strip()  # fmt: skip
    reader_token = stack.manage(
        "api_token", "olivia.operator", "--name", "reader", "--scope", "runs:read"
    ).strip()
    admin_token = stack.manage(
        "api_token", "ada.admin", "--name", "admin-agent",
        "--scope", "tools:call", "--scope", "approvals:decide",
    ).strip()  # fmt: skip
    reviewer_token = stack.manage(
        "api_token", "rory.reviewer", "--name", "approvals-desk",
        "--scope", "approvals:read", "--scope", "approvals:decide",
    ).strip()  # fmt: skip
    invoice = next(i for i in PortalState().invoices() if i.status == "open")

    # No token: the endpoint answers 401 before any MCP.
    # Our own loopback base URL, never a user-supplied scheme.
    request = urllib.request.Request(f"{stack.url}/mcp/", data=b"{}", method="POST")  # noqa: S310
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)  # noqa: S310
    assert refused.value.code == 401

    async def listing(session: ClientSession) -> list[types.Tool]:
        return (await session.list_tools()).tools

    tools = {t.name: t for t in in_own_loop(agent(stack, agent_token, listing))}
    assert set(tools) == {"acme-download-invoices", "acme-pay-invoice", "run_status", "run_cancel"}
    published = api(stack, agent_token, "GET", "/workflows/acme-pay-invoice/versions/1")
    assert tools["acme-pay-invoice"].input_schema == published["inputs_schema"]
    outputs = tools["acme-pay-invoice"].output_schema["properties"]["outputs"]["properties"]
    assert "receipt" in outputs
    assert in_own_loop(agent(stack, reader_token, listing)) == []

    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    async def ignore(progress: float, total: float | None, message: str | None) -> None:
        pass

    async def download_and_pay(session: ClientSession) -> dict[str, Any]:
        download = await session.call_tool(
            "acme-download-invoices", {"month": "2026-11"}, progress_callback=on_progress
        )
        bad = await session.call_tool(
            "acme-pay-invoice", {"invoice": "'; approve all", "amount": "12.00"}
        )
        observed = await session.read_resource(
            f"pandaweb://runs/{download.structured_content['run_id']}/steps/1/observation"
        )
        pay = await session.call_tool(
            "acme-pay-invoice",
            {"invoice": invoice.number, "amount": f"{invoice.amount_due:.2f}"},
            progress_callback=ignore,
        )
        return {"download": download, "bad": bad, "pay": pay, "observed": observed}

    calls = in_own_loop(agent(stack, agent_token, download_and_pay))
    download = calls["download"]
    assert not download.is_error, (text(download), stack.log_tail())
    assert download.structured_content["status"] == "succeeded"
    assert download.structured_content["outputs"]["summary"], download.structured_content
    assert download.structured_content["run_url"].startswith(f"{stack.url}/runs/")
    assert seen
    assert seen == sorted(seen)

    observation = calls["observed"].contents[0]
    assert isinstance(observation, types.TextResourceContents)
    assert "invoice" in observation.text.lower(), observation.text[:500]

    bad = calls["bad"]
    assert bad.is_error
    assert "The inputs are not valid" in text(bad)
    assert "invoice" in text(bad)

    pay = calls["pay"]
    assert not pay.is_error, (text(pay), stack.log_tail())
    waiting = pay.structured_content
    assert waiting["status"] == "awaiting_approval"
    assert waiting["message"].startswith("waiting for approval")
    assert "/approvals/" in waiting["approval"]["url"]
    assert waiting["approval"]["expires_at"]
    run_id = waiting["run_id"]

    # Someone else's run looks like a missing one, whatever the token may do elsewhere.
    async def meddle(session: ClientSession) -> tuple[types.CallToolResult, list[str], str]:
        cancel = await session.call_tool("run_cancel", {"run_id": run_id})
        names = [t.name for t in (await session.list_tools()).tools]
        try:
            await session.read_resource(f"pandaweb://runs/{run_id}/steps/0/observation")
        except MCPError as exc:
            return cancel, names, str(exc)
        return cancel, names, ""

    cancel, admin_tools, unreadable = in_own_loop(agent(stack, admin_token, meddle))
    assert "Unknown resource" in unreadable
    assert cancel.is_error
    assert f"no run #{run_id}" in text(cancel)
    assert not [n for n in admin_tools if "approv" in n]

    # The person decides, in the approvals service (here through the reviewer's API token).
    request = api(stack, reviewer_token, "GET", f"/approvals/{waiting['approval']['id']}")
    decided = api(
        stack, reviewer_token, "POST", f"/approvals/{request['id']}/decision",
        {"verdict": "approve", "evidence_sha256": request["evidence_sha256"]},
    )  # fmt: skip
    assert decided["status"] == "approved"

    async def follow(session: ClientSession) -> types.CallToolResult:
        deadline = time.monotonic() + 180
        while True:
            status = await session.call_tool("run_status", {"run_id": run_id})
            if status.structured_content["status"] not in ("awaiting_approval", "running"):
                return status
            assert time.monotonic() < deadline, stack.log_tail()
            await asyncio.sleep(1)

    final = in_own_loop(agent(stack, agent_token, follow))
    assert final.structured_content["status"] == "succeeded", (text(final), stack.log_tail())
    assert str(final.structured_content["outputs"]["receipt"]).startswith("RCPT-")
    assert "portal-demo" not in json.dumps(final.structured_content)  # no credential

    via = stack.manage(
        "shell", "-c",
        "import json; from pandaweb.audit.models import AuditEvent; "
        f"print(json.dumps(AuditEvent.objects.get(action='run.launched', run_id={run_id}).extra))",
    ).strip().splitlines()[-1]  # fmt: skip
    assert json.loads(via)["via"] == {
        "channel": "mcp",
        "client": "test-agent",
        "id": json.loads(via)["via"]["id"],
        "name": "agent",
        "kind": "personal",
    }
