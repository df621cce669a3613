"""The approval gate for real: the demo workflow in a local sandbox (system Chromium) behind its
egress proxy, against the bundled demo portal, stopping before its irreversible step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from django.conf import settings
from django.contrib.auth.models import User
from playwright.sync_api import sync_playwright

from approvals import services as approvals
from approvals.models import ApprovalRequest
from pandaweb.core.roles import Role
from pandaweb.demo_portal.server import PortalServer
from sessions import services
from sessions.models import Run
from tests.demo_portal.conftest import fetch_json
from tests.factories import user_with_role
from tests.sessions.conftest import EXAMPLE, publish
from workflows.models import Credential

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def run_files_in_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(settings, "RUN_FILES_DIR", tmp_path / "runs")


@pytest.fixture
def continuations(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Continuations the decisions queue (run here by the test, in this process)."""
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(
        "pandaweb.core.dispatch.dispatch",
        lambda task, queue=None, **kwargs: sent.append({"task": task.name, **kwargs}),
    )
    return sent


@pytest.fixture
def reviewer(db: None) -> User:
    return user_with_role(Role.REVIEWERS, username="rory")


def browsers_of(run: Run) -> list[psutil.Process]:
    key = f"run-{run.pk}-"
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if any(key in part for part in process.info["cmdline"] or []):
                found.append(process)
        except psutil.NoSuchProcess:
            continue
    return found


def gated_run(operator: User, portal_server: PortalServer, portal: str) -> Run:
    document = yaml.safe_load(
        EXAMPLE.read_text().replace("127.0.0.1:8001", portal.removeprefix("http://"))
    )
    workflow = publish(operator, document)
    invoice = next(i for i in portal_server.state.invoices() if i.status == "open")
    run = services.run_launch(
        workflow_id=workflow.pk,
        user=operator,
        raw_inputs={"invoice": invoice.number, "amount": f"{invoice.amount_due:.2f}"},
    )
    services.run_execute(run_id=run.pk)
    run.refresh_from_db()
    return run


def test_the_gate_holds_the_payment_until_a_reviewer_approves_then_pays_once(
    operator: User,
    acme_credential: Credential,
    reviewer: User,
    portal_server: PortalServer,
    portal: str,
    continuations: list[dict[str, Any]],
) -> None:
    run = gated_run(operator, portal_server, portal)

    assert run.status == Run.Status.AWAITING_APPROVAL, run.failure_reason
    approval = run.approvals.get()
    evidence = approval.evidence
    assert approval.action == (
        f"Click the button 'Submit payment' on {portal}/invoices/{run.inputs['invoice']}/pay"
    )
    assert evidence["target"]["tag"] == "button"
    assert evidence["target"]["text"] == "Submit payment"
    assert {f["step_id"]: f["value"] for f in evidence["filled"]} == {
        "fill-amount": run.inputs["amount"],
        "fill-iban": run.inputs["iban"],
    }
    assert evidence["outputs"]["total"] == run.inputs["amount"]
    assert "Submit payment" in evidence["page_text"]
    assert approval.evidence_sha256 == approvals.evidence_hash(evidence)
    files = Path(settings.RUN_FILES_DIR) / str(run.pk)
    assert (files / approval.outlined).read_bytes() != (files / approval.screenshot).read_bytes()
    assert browsers_of(run), "the browser must wait, alive, for the decision"
    assert fetch_json(f"{portal}/api/payments") == []

    approvals.approval_decide(
        approval_id=approval.pk,
        user=reviewer,
        approve=True,
        evidence_sha256=approval.evidence_sha256,
    )
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    assert continuations == [
        {"task": "runs.continue", "run_id": run.pk, "approval_id": approval.pk}
    ]

    services.run_continue(run_id=run.pk, approval_id=approval.pk)
    services.run_continue(run_id=run.pk, approval_id=approval.pk)  # a duplicate changes nothing

    run.refresh_from_db()
    approval.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.failure_reason
    assert approval.intent_at is not None
    assert approval.completed_at is not None
    payments = fetch_json(f"{portal}/api/payments")
    assert len(payments) == 1
    assert payments[0]["invoice"] == run.inputs["invoice"]
    assert browsers_of(run) == []


def test_a_rejection_cancels_the_run_and_nothing_is_paid(
    operator: User,
    acme_credential: Credential,
    reviewer: User,
    portal_server: PortalServer,
    portal: str,
    continuations: list[dict[str, Any]],
) -> None:
    run = gated_run(operator, portal_server, portal)
    approval = run.approvals.get()

    with pytest.raises(approvals.ApprovalRefused, match="needs a reason"):
        approvals.approval_decide(
            approval_id=approval.pk, user=reviewer, approve=False, evidence_sha256="x"
        )
    approvals.approval_decide(
        approval_id=approval.pk,
        user=reviewer,
        approve=False,
        reason="wrong IBAN",
        evidence_sha256=approval.evidence_sha256,
    )

    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    assert run.failure_reason == "rejected by rory: wrong IBAN"
    assert continuations == []
    assert browsers_of(run) == []
    assert fetch_json(f"{portal}/api/payments") == []


def test_a_page_that_changed_since_approval_is_not_acted_on_but_asked_again(
    operator: User,
    acme_credential: Credential,
    reviewer: User,
    portal_server: PortalServer,
    portal: str,
    continuations: list[dict[str, Any]],
) -> None:
    run = gated_run(operator, portal_server, portal)
    approval = run.approvals.get()
    # The page changes under the waiting robot (as a portal that re-prices a draft would).
    assert run.sandbox is not None
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(run.sandbox["cdp_url"])
        page = browser.contexts[0].pages[-1]
        page.get_by_test_id("confirm-amount").evaluate("e => { e.textContent = 'EUR 9,999.00' }")
        browser.close()

    approvals.approval_decide(
        approval_id=approval.pk,
        user=reviewer,
        approve=True,
        evidence_sha256=approval.evidence_sha256,
    )
    services.run_continue(run_id=run.pk, approval_id=approval.pk)

    run.refresh_from_db()
    approval.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    assert approval.status == ApprovalRequest.Status.VOIDED
    assert approval.intent_at is None
    again = approval.superseded_by
    assert again.status == ApprovalRequest.Status.PENDING
    assert any("9,999.00" in change for change in again.evidence["changes"]), again.evidence["changes"]
    assert fetch_json(f"{portal}/api/payments") == []

    services.run_cancel(run_id=run.pk, user=operator)
    again.refresh_from_db()
    assert again.status == ApprovalRequest.Status.VOIDED
    assert browsers_of(run) == []
