from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from pandaweb.audit.models import AuditEvent
from sessions.models import Run
from workflows.models import Workflow

pytestmark = pytest.mark.django_db


def run_command(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_it_launches_through_the_service_as_the_named_user(
    operator: User, demo_workflow: Workflow
) -> None:
    out = run_command(
        "run_launch", "--workflow", "acme-pay-invoice", "--input", "invoice=INV-1001",
        "--input", "amount=12.50", "--as", "olivia", "--idempotency-key", "cron-1",
    )  # fmt: skip
    run = Run.objects.get()
    assert out.strip() == f"run {run.pk} queued"
    assert run.launched_by == operator
    assert run.inputs["amount"] == "12.50"
    assert AuditEvent.objects.get(action="run.launched").actor == operator
    run_command(
        "run_launch", "--workflow", "acme-pay-invoice", "--input", "invoice=INV-1001",
        "--input", "amount=12.50", "--as", "olivia", "--idempotency-key", "cron-1",
    )  # fmt: skip
    assert Run.objects.count() == 1


def test_it_refuses_invalid_inputs_with_exit_code_2(
    operator: User, demo_workflow: Workflow
) -> None:
    with pytest.raises(CommandError) as refused:
        run_command(
            "run_launch",
            "--workflow",
            "acme-pay-invoice",
            "--input",
            "invoice=bad",
            "--as",
            "olivia",
        )
    assert refused.value.returncode == 2
    assert "invoice" in str(refused.value)
    assert "amount" in str(refused.value)
    assert not Run.objects.exists()


def test_it_refuses_a_user_who_may_not_launch(reviewer: User, demo_workflow: Workflow) -> None:
    for who in ("rory", "nobody"):
        with pytest.raises(CommandError, match="may not launch runs"):
            run_command("run_launch", "--workflow", "acme-pay-invoice", "--as", who)
    assert not Run.objects.exists()


def test_wait_reports_the_final_status(
    operator: User, demo_workflow: Workflow, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sessions import services

    def finish_at_once(task: object, **kwargs: int) -> None:
        Run.objects.filter(pk=kwargs["run_id"]).update(status=Run.Status.FAILED)

    monkeypatch.setattr(services.runstate, "dispatch", finish_at_once)
    with pytest.raises(CommandError) as ended:
        run_command(
            "run_launch", "--workflow", "acme-pay-invoice", "--input", "invoice=INV-1001",
            "--input", "amount=1.00", "--as", "olivia", "--wait", "--json",
        )  # fmt: skip
    assert ended.value.returncode == 1


def test_show_prints_the_run_as_the_api_does(operator: User, demo_workflow: Workflow) -> None:
    run_command(
        "run_launch", "--workflow", "acme-pay-invoice", "--input", "invoice=INV-1001",
        "--input", "amount=1.00", "--as", "olivia",
    )  # fmt: skip
    run = Run.objects.get()
    document = json.loads(run_command("run_show", str(run.pk), "--json"))
    assert document["id"] == run.pk
    assert document["inputs"]["invoice"] == "INV-1001"
    text = run_command("run_show", str(run.pk))
    assert f"Run {run.pk} of acme-pay-invoice v1: queued" in text
    assert "invoice = INV-1001" in text
    with pytest.raises(CommandError):
        run_command("run_show", str(run.pk + 100))


def test_api_token_prints_a_working_secret_once(operator: User) -> None:
    from pandaweb.api.services import token_authenticate

    raw = run_command("api_token", "olivia", "--name", "cron", "--scope", "runs:read").strip()
    context = token_authenticate(raw)
    assert context is not None
    assert context.user == operator
    with pytest.raises(CommandError, match="scopes"):
        run_command("api_token", "olivia", "--name", "x", "--scope", "approvals:decide")


def test_api_token_makes_a_service_account_for_an_admin() -> None:
    from pandaweb.api.services import token_authenticate
    from pandaweb.core.roles import Role
    from tests.factories import user_with_role

    user_with_role(Role.ADMINS, username="ada")
    raw = run_command(
        "api_token", "erp", "--name", "erp", "--service", "--role", "Operators",
        "--role", "Compliance", "--by", "ada", "--scope", "runs:launch", "--scope", "audit:read",
    ).strip()  # fmt: skip
    context = token_authenticate(raw)
    assert context is not None
    assert context.kind == "service"
    assert {s.value for s in context.effective} == {"runs:launch", "audit:read"}


def test_a_reused_key_with_other_inputs_is_refused_and_launches_nothing(
    operator: User, demo_workflow: Workflow
) -> None:
    launch = ("run_launch", "--workflow", "acme-pay-invoice", "--as", "olivia")
    key = ("--idempotency-key", "erp-4712")
    run_command(*launch, "--input", "invoice=INV-1001", "--input", "amount=12.50", *key)
    with pytest.raises(CommandError) as refused:
        run_command(*launch, "--input", "invoice=INV-1002", "--input", "amount=12.50", *key)
    assert refused.value.returncode == 2
    assert "already used for a different launch" in str(refused.value)
    assert Run.objects.count() == 1
    assert Run.objects.get().inputs["invoice"] == "INV-1001"


def test_wait_returns_when_the_run_waits_for_a_reviewer(
    operator: User, demo_workflow: Workflow, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sessions import services

    def reach_the_gate(task: object, **kwargs: int) -> None:
        Run.objects.filter(pk=kwargs["run_id"]).update(status=Run.Status.AWAITING_APPROVAL)

    monkeypatch.setattr(services.runstate, "dispatch", reach_the_gate)
    with pytest.raises(CommandError) as waiting:
        run_command(
            "run_launch", "--workflow", "acme-pay-invoice", "--input", "invoice=INV-1001",
            "--input", "amount=1.00", "--as", "olivia", "--wait", "--timeout", "30",
        )  # fmt: skip
    assert waiting.value.returncode == 4
    assert "awaiting_approval" in str(waiting.value)
