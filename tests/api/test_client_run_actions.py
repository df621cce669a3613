"""The client library and the ``pandaweb`` command against a live server: answering a run's
question, running again and continuing, reconciling, and healing a failed step."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from pandaweb_client import ApiError
from pandaweb_client import Client as PandawebClient
from pandaweb_client.cli import main as pandaweb_command
from pytest_django.live_server_helper import LiveServer

from approvals.models import ApprovalDecision, ApprovalRequest, Question
from pandaweb.core.roles import Role
from sessions.models import Run
from tests.api.conftest import make_token
from tests.approvals.test_questions import asking
from tests.factories import ApprovalRequestFactory, user_with_role
from tests.patching import patch_dispatch
from tests.sessions.healing import REVIEW, failed_at
from workflows.models import Workflow, WorkflowVersion

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs are put in their states by hand; what a change queues is not executed."""
    patch_dispatch(monkeypatch, lambda task, queue=None, **kw: None)


def test_the_client_answers_runs_again_continues_and_heals(
    live_server: LiveServer, operator: User, demo_workflow: Workflow, run_files_in_tmp: Path
) -> None:
    question = asking(operator, demo_workflow, kind="text")
    failed = failed_at(operator, demo_workflow, REVIEW, "review", ["Back", "Check the payment"])
    Run.objects.filter(pk=failed.pk).update(outputs={"amount_seen": "12.00"})

    with PandawebClient(live_server.url, make_token(operator)) as client:
        answered = client.answer(question.run_id, "fine")
        with pytest.raises(LookupError, match="waits for no answer"):
            client.answer(question.run_id, "again")
        steps = client.run(failed.pk).continue_from
        rerun = client.again(failed.pk)
        continued = client.again(failed.pk, start_step="open-pay-form", idempotency_key="k1")
        replayed = client.again(failed.pk, start_step="open-pay-form", idempotency_key="k1")
        with pytest.raises(ApiError) as refused:
            client.again(failed.pk, start_step="no-such-step")
        proposal = client.healing(failed.pk, REVIEW)
        draft = client.heal(failed.pk, REVIEW, number=proposal.candidates[0]["number"])

    assert answered["run_status"] == "running"
    assert Question.objects.get(pk=question.pk).answer == "fine"
    assert all(step["allowed"] for step in steps)
    assert (rerun.raw["rerun_of"], rerun.inputs) == (failed.pk, failed.inputs)
    assert (continued.raw["start_step"], continued.outputs) == (
        "open-pay-form",
        {"amount_seen": "12.00"},
    )
    assert replayed.id == continued.id
    assert refused.value.status == 422
    assert refused.value.errors[0]["field"] == "start_step"
    assert proposal.candidates[0]["name"] == "Check the payment"
    review = next(s for s in draft.document["steps"] if s["id"] == "review")
    assert review["target"]["name"] == "Check the payment"
    assert demo_workflow.versions.filter(status=WorkflowVersion.Status.DRAFT).exists()


def test_the_command_reconciles_and_shows_a_failed_steps_candidates(
    live_server: LiveServer,
    operator: User,
    demo_workflow: Workflow,
    run_files_in_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    approval = ApprovalRequestFactory.create()
    rory = user_with_role(Role.REVIEWERS, username="rory")
    ApprovalDecision.objects.create(
        request=approval, reviewer=rory, verdict=ApprovalDecision.Verdict.APPROVE,
        evidence_sha256=approval.evidence_sha256,
    )  # fmt: skip
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        status=ApprovalRequest.Status.APPROVED, intent_at=timezone.now()
    )
    Run.objects.filter(pk=approval.run_id).update(status=Run.Status.NEEDS_RECONCILIATION)
    failed = failed_at(operator, demo_workflow, REVIEW, "review", ["Back", "Check the payment"])
    url = ["--url", live_server.url]

    def said(token_of: User, *args: str, exit_code: int = 0) -> tuple[str, str]:
        monkeypatch.setenv("PANDAWEB_TOKEN", make_token(token_of))
        assert pandaweb_command([*url, *args]) == exit_code
        return capsys.readouterr()

    _, refusal = said(
        rory, "reconcile", str(approval.run_id), "--happened", "--note", "x", exit_code=1
    )
    vera = user_with_role(Role.REVIEWERS, username="vera")
    out, _ = said(vera, "reconcile", str(approval.run_id), "--happened", "--note", "RCPT-1 seen")
    shown, _ = said(operator, "heal", str(failed.pk), str(REVIEW))
    healed, _ = said(operator, "heal", str(failed.pk), str(REVIEW), "--target", 'button "Check"')

    assert "you approved this action" in refusal
    assert out.strip() == f"run #{approval.run_id} {approval.run.workflow.slug}: succeeded"
    assert shown.splitlines()[0] == "step review (target) looked for the button 'Review payment'"
    assert "[2] button 'Check the payment' exact" in shown
    assert healed.startswith("draft of acme-pay-invoice: 0 problems")
