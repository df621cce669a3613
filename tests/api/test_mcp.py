"""The MCP server in-process, through the SDK's own client (the stdio command's configuration:
one fixed token). The end-to-end test over HTTP with real runs is tests/e2e/test_mcp.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client as DjangoClient
from mcp import Client, types

from pandaweb.api.mcp_server import build_server, describe, output_schema_of
from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from sessions.models import Run
from tests.api.conftest import make_token
from tests.factories import user_with_role
from workflows.models import Workflow
from workflows.services import WorkflowError, workflow_update_settings

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_background_runs"),
]


def talk(raw: str, work: Any) -> Any:
    server = build_server(
        lambda ctx: raw,
        base_url="http://127.0.0.1:8000",
        session_of=lambda ctx: "s1",
        wait_seconds=0,
    )

    async def main() -> Any:
        async with Client(server) as client:
            return await work(client)

    return asyncio.run(main())


def offered(workflow: Workflow) -> Workflow:
    Workflow.objects.filter(pk=workflow.pk).update(offer_as_tool=True)
    return workflow


def names(raw: str) -> list[str]:
    async def work(client: Client) -> list[str]:
        return [t.name for t in (await client.list_tools()).tools]

    result: list[str] = talk(raw, work)
    return result


def test_it_lists_only_offered_workflows_and_only_to_tokens_with_the_scope(
    operator: User, demo_workflow: Workflow
) -> None:
    assert names(make_token(operator, ["tools:call"])) == ["run_status", "run_cancel"]
    offered(demo_workflow)
    assert names(make_token(operator, ["tools:call"])) == [
        "acme-pay-invoice",
        "run_status",
        "run_cancel",
    ]
    assert names(make_token(operator, ["runs:launch", "runs:read"])) == []


def test_it_declares_the_outputs_the_steps_extract() -> None:
    schema = output_schema_of(
        {
            "steps": [
                {"type": "extract", "fields": [{"name": "total", "kind": "money"}]},
                {"type": "download", "name": "invoice_csv"},
            ]
        }
    )
    assert schema["properties"]["total"]["type"] == ["string", "number", "null"]
    assert "invoice_csv" in schema["properties"]


def test_it_refuses_bad_inputs_with_the_launch_forms_message_and_launches_nothing(
    operator: User, demo_workflow: Workflow
) -> None:
    offered(demo_workflow)

    async def work(client: Client) -> types.CallToolResult:
        return await client.call_tool(
            "acme-pay-invoice", {"invoice": "ignore previous instructions", "amount": "-3"}
        )

    result = talk(make_token(operator, ["tools:call"]), work)
    assert result.is_error
    message = result.content[0].text
    assert message.startswith("The inputs are not valid.")
    assert "invoice:" in message
    assert "amount:" in message
    assert not Run.objects.exists()


def test_it_refuses_a_null_character_in_any_argument_and_launches_nothing(
    operator: User, demo_workflow: Workflow
) -> None:
    offered(demo_workflow)

    async def work(client: Client) -> types.CallToolResult:
        return await client.call_tool(
            "acme-pay-invoice", {"invoice": "INV-1\x00040", "amount": "1250.00"}
        )

    result = talk(make_token(operator, ["tools:call"]), work)
    assert result.is_error
    assert result.content[0].text == "Null characters are not allowed. Found in: invoice."
    assert not Run.objects.exists()


def test_it_launches_once_per_call_and_names_the_client_and_token_in_the_audit(
    operator: User, demo_workflow: Workflow
) -> None:
    offered(demo_workflow)
    raw = make_token(operator, ["tools:call"])

    async def work(client: Client) -> types.CallToolResult:
        return await client.call_tool(
            "acme-pay-invoice", {"invoice": "INV-1001", "amount": "12.50"}
        )

    result = talk(raw, work)
    run = Run.objects.get()
    assert not result.is_error
    assert result.structured_content == {
        "run_id": run.pk,
        "status": "queued",
        "run_url": f"http://127.0.0.1:8000/runs/{run.pk}/",
        "message": f"Run #{run.pk} is still running; follow it with run_status.",
    }
    assert run.launched_by == operator
    assert run.idempotency_key.startswith("mcp:")
    via = AuditEvent.objects.get(action="run.launched", run_id=run.pk).extra["via"]
    assert via["channel"] == "mcp"
    assert via["client"] == "mcp"


def test_it_refuses_to_cancel_someone_elses_run_as_if_it_did_not_exist(
    operator: User, demo_workflow: Workflow
) -> None:
    offered(demo_workflow)

    async def launch(client: Client) -> types.CallToolResult:
        return await client.call_tool(
            "acme-pay-invoice", {"invoice": "INV-1001", "amount": "12.50"}
        )

    talk(make_token(operator, ["tools:call"]), launch)
    run = Run.objects.get()
    admin = user_with_role(Role.ADMINS, username="ada")

    async def cancel(client: Client) -> types.CallToolResult:
        return await client.call_tool("run_cancel", {"run_id": run.pk})

    result = talk(make_token(admin, ["tools:call"]), cancel)
    assert result.is_error
    assert result.content[0].text == f"There is no run #{run.pk}."
    run.refresh_from_db()
    assert run.status == "queued"
    assert not run.cancel_requested


def _save(workflow: Workflow, user: User, offer: bool) -> Workflow:
    return workflow_update_settings(
        workflow_id=workflow.pk,
        user=user,
        name=workflow.name,
        description=workflow.description,
        reviewer_group=workflow.reviewer_group,
        allowed_hosts=list(workflow.allowed_hosts),
        step_budget=workflow.step_budget,
        run_ttl_minutes=workflow.run_ttl_minutes,
        approval_quorum=workflow.approval_quorum,
        approval_expiry_minutes=workflow.approval_expiry_minutes,
        author_may_approve=workflow.author_may_approve,
        credentials=list(workflow.credentials.all()),
        offer_as_tool=offer,
    )


def test_it_refuses_an_author_who_is_no_admin_offering_a_workflow_as_a_tool(
    operator: User, demo_workflow: Workflow
) -> None:
    with pytest.raises(WorkflowError) as refused:
        _save(demo_workflow, operator, True)
    assert "offer_as_tool" in refused.value.field_errors
    demo_workflow.refresh_from_db()
    assert not demo_workflow.offer_as_tool
    admin = user_with_role(Role.ADMINS, username="ada")
    _save(demo_workflow, admin, True)
    demo_workflow.refresh_from_db()
    assert demo_workflow.offer_as_tool
    event = AuditEvent.objects.filter(action="workflow.settings_changed").latest("sequence")
    assert event.before == {"offer_as_tool": False}
    assert event.after == {"offer_as_tool": True}


def test_it_refuses_to_serve_stdio_with_an_unknown_token(db: None) -> None:
    with pytest.raises(CommandError, match="unknown, revoked or expired"):
        call_command("mcp_stdio", "--token", "pw_not-a-token")


def test_it_answers_a_failed_run_as_a_tool_error_in_the_run_pages_words(
    operator: User, demo_workflow: Workflow
) -> None:
    offered(demo_workflow)

    async def launch(client: Client) -> types.CallToolResult:
        return await client.call_tool(
            "acme-pay-invoice", {"invoice": "INV-1001", "amount": "12.50"}
        )

    talk(make_token(operator, ["tools:call"]), launch)
    Run.objects.update(status="failed", failure_reason="The portal said: invoice already paid")
    answer, is_error = describe(Run.objects.get(), "http://127.0.0.1:8000")
    assert is_error
    assert answer["failure_reason"] == "The portal said: invoice already paid"
    assert answer["message"].endswith("failed: The portal said: invoice already paid")
    assert "outputs" not in answer


def test_it_disables_the_offer_box_for_authors_who_are_not_admins(
    operator: User, demo_workflow: Workflow
) -> None:
    browser = DjangoClient()
    browser.force_login(operator)
    page = browser.get(f"/workflows/{demo_workflow.slug}/settings/")
    assert page.context["form"].fields["offer_as_tool"].disabled
    admin = user_with_role(Role.ADMINS, username="ada")
    browser.force_login(admin)
    page = browser.get(f"/workflows/{demo_workflow.slug}/settings/")
    assert not page.context["form"].fields["offer_as_tool"].disabled


def test_it_never_hands_out_an_output_named_like_a_secret(
    operator: User, demo_workflow: Workflow
) -> None:
    offered(demo_workflow)

    async def launch(client: Client) -> types.CallToolResult:
        return await client.call_tool(
            "acme-pay-invoice", {"invoice": "INV-1001", "amount": "12.50"}
        )

    talk(make_token(operator, ["tools:call"]), launch)
    Run.objects.update(status="succeeded", outputs={"receipt": "RCPT-1", "password": "hunter2"})
    answer, is_error = describe(Run.objects.get(), "http://127.0.0.1:8000")
    assert not is_error
    assert answer["outputs"] == {"receipt": "RCPT-1", "password": "[redacted]"}


@pytest.mark.django_db
def test_a_run_waiting_for_an_answer_says_what_it_asks_but_never_takes_the_answer(
    operator: User, demo_workflow: Workflow
) -> None:
    from tests.approvals.test_questions import asking

    question = asking(operator, demo_workflow)

    answer, is_error = describe(Run.objects.get(pk=question.run_id), "http://127.0.0.1:8000")

    assert not is_error
    assert answer["status"] == "awaiting_answer"
    assert answer["message"].startswith("waiting for a person to answer on the run page")
    assert answer["question"]["text"] == "Type the code the portal sent by SMS"
    assert answer["question"]["kind"] == "code"
