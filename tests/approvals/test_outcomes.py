"""An irreversible step is done only when the portal says so, and a click answers the dialog it
opens as the workflow says: for real, in a local sandbox (system Chromium) against the demo
portal's lab."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from django.contrib.auth.models import User

from approvals import services as approvals
from approvals.models import ApprovalRequest
from pandaweb.audit.models import AuditEvent
from pandaweb.demo_portal.server import PortalServer
from sessions import services
from sessions.models import Run, StepResult
from sessions.services import execution
from tests.demo_portal.conftest import fetch_json
from tests.sessions.conftest import publish
from workflows import services as workflow_services
from workflows.models import Credential

pytestmark = [
    pytest.mark.usefixtures("run_files_in_tmp"),
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]

CONFIRM = (
    "Remove supplier Northwind Traders? Open invoices stay, but no new orders can be placed. "
    "This cannot be undone."
)


def lab_run(
    operator: User, portal: str, *steps: dict[str, Any], credential: str = "acme-portal"
) -> Run:
    """Log in to the portal, then ``steps``; executed until it ends or waits at its gate."""
    document: dict[str, object] = {
        "name": "Lab outcome",
        "slug": "lab-outcome",
        "settings": {
            "allowed_hosts": [portal.removeprefix("http://")],
            "credentials": [credential],
        },
        "steps": [
            {"id": "open-login", "type": "goto", "url": f"{portal}/login"},
            {
                "id": "log-in",
                "type": "login",
                "credential": credential,
                "username": {"label": "Username"},
                "password": {"label": "Password"},
                "submit": {"role": "button", "name": "Sign in"},
            },
            *steps,
        ],
    }
    workflow = publish(operator, document)
    run = services.run_launch(workflow_id=workflow.pk, user=operator, raw_inputs={})
    execution.run_execute(run_id=run.pk)
    run.refresh_from_db()
    return run


def approve_and_continue(run: Run, reviewer: User) -> tuple[Run, ApprovalRequest]:
    assert run.status == Run.Status.AWAITING_APPROVAL, run.failure_reason
    approval = run.approvals.get()
    approvals.approval_decide(
        approval_id=approval.pk,
        user=reviewer,
        approve=True,
        evidence_sha256=approval.evidence_sha256,
    )
    execution.run_continue(run_id=run.pk, approval_id=approval.pk)
    run.refresh_from_db()
    approval.refresh_from_db()
    return run, approval


def step(run: Run, step_id: str) -> StepResult:
    return run.step_results.get(step_id=step_id)


APPROVE = {
    "id": "approve",
    "type": "click",
    "irreversible": True,
    "target": {"role": "button", "name": "Approve invoice"},
    "expect": {"text": "approved for payment"},
}


def test_an_approval_the_portal_refuses_fails_the_run_in_its_words_and_is_not_done(
    operator: User,
    acme_credential: Credential,
    reviewer: User,
    portal: str,
    continuations: list[dict[str, Any]],
) -> None:
    run = lab_run(
        operator,
        portal,
        {"id": "open", "type": "goto", "url": f"{portal}/lab/approvals/INV-1039"},
        APPROVE,
    )
    approval = run.approvals.get()
    assert approval.evidence["expect"] == "the page shows 'approved for payment'"
    # While the reviewer looks, a colleague approves the invoice in the portal itself.
    fetch_json(f"{portal}/api/lab/approvals/INV-1039", method="POST")

    run, approval = approve_and_continue(run, reviewer)

    assert run.status == Run.Status.FAILED
    assert run.failure_reason.startswith(
        "the portal refused: This invoice was already approved by colleague on"
    )
    assert "no second approval was recorded" in run.failure_reason
    assert run.failure_step == "approve"
    assert step(run, "approve").status == StepResult.Status.FAILED
    assert approval.intent_at is not None
    assert approval.completed_at is None
    assert approval.refused_at is not None
    assert "no second approval was recorded" in approval.action_result
    assert AuditEvent.objects.filter(action="approval.action_refused", run_id=run.pk).count() == 1
    assert not AuditEvent.objects.filter(action="approval.action_completed", run_id=run.pk).exists()
    approved = fetch_json(f"{portal}/api/lab")["approvals"]
    assert [(a["invoice"], a["by"]) for a in approved] == [("INV-1039", "colleague")]


def test_an_approval_the_portal_confirms_succeeds(
    operator: User,
    acme_credential: Credential,
    reviewer: User,
    portal: str,
    continuations: list[dict[str, Any]],
) -> None:
    run = lab_run(
        operator,
        portal,
        {"id": "open", "type": "goto", "url": f"{portal}/lab/approvals/INV-1038"},
        APPROVE,
    )

    run, approval = approve_and_continue(run, reviewer)

    assert run.status == Run.Status.SUCCEEDED, run.failure_reason
    assert approval.completed_at is not None
    assert approval.refused_at is None
    assert approval.action_result == (
        "the portal showed the expected outcome: the page shows 'approved for payment'"
    )
    approved = fetch_json(f"{portal}/api/lab")["approvals"]
    assert [(a["invoice"], a["by"]) for a in approved] == [("INV-1038", "acme-demo")]


def test_an_approval_whose_answer_is_lost_needs_reconciliation_not_a_refusal(
    operator: User,
    acme_credential: Credential,
    reviewer: User,
    portal: str,
    portal_server: PortalServer,
    continuations: list[dict[str, Any]],
) -> None:
    run = lab_run(
        operator,
        portal,
        {"id": "open", "type": "goto", "url": f"{portal}/lab/approvals/INV-1035"},
        {**APPROVE, "timeout_ms": 3000},
    )
    # The portal records the approval, then its answer is lost on the way back.
    portal_server.dropped_paths = {r"^/lab/approvals/INV-1035$"}

    run, approval = approve_and_continue(run, reviewer)

    assert run.status == Run.Status.NEEDS_RECONCILIATION, run.failure_reason
    assert run.failure_reason == (
        "the approved action was sent and its outcome is unknown: no answer from the portal: "
        f"the egress proxy answered HTTP 502 to POST {portal}/lab/approvals/INV-1035: "
        f"the origin closed the connection without a response (the browser is at {portal}/lab/"
        "approvals/INV-1035) — the approved action may have happened; check the portal"
    )
    assert "refused" not in run.failure_reason
    assert approval.intent_at is not None
    assert (approval.completed_at, approval.refused_at) == (None, None)
    assert not AuditEvent.objects.filter(action="approval.action_refused", run_id=run.pk).exists()
    approved = fetch_json(f"{portal}/api/lab")["approvals"]
    assert [(a["invoice"], a["by"]) for a in approved] == [("INV-1035", "acme-demo")]


def test_an_ordinary_step_whose_answer_is_lost_fails_without_saying_the_portal_refused(
    operator: User, acme_credential: Credential, portal: str, portal_server: PortalServer
) -> None:
    portal_server.dropped_paths = {r"^/lab/approvals/INV-1034$"}

    run = lab_run(
        operator,
        portal,
        {"id": "open", "type": "goto", "url": f"{portal}/lab/approvals/INV-1034"},
        {**APPROVE, "irreversible": False, "timeout_ms": 3000},
    )

    assert run.status == Run.Status.FAILED
    assert run.failure_step == "approve"
    assert run.failure_reason.startswith(
        "no answer from the portal: the egress proxy answered HTTP 502 to POST "
        f"{portal}/lab/approvals/INV-1034: the origin closed the connection without a response"
    )


def test_an_approval_the_portal_answers_with_a_4xx_in_its_words_is_refused(
    operator: User,
    acme_credential: Credential,
    reviewer: User,
    portal: str,
    continuations: list[dict[str, Any]],
) -> None:
    # A colleague approved; the e-mailed request's page still offers the button, and the
    # portal's API answers 409 with its reason.
    fetch_json(f"{portal}/api/lab/approvals/INV-1036", method="POST")
    run = lab_run(
        operator,
        portal,
        {"id": "open", "type": "goto", "url": f"{portal}/lab/approval-request/INV-1036"},
        {**APPROVE, "target": {"role": "button", "name": "Approve INV-1036"}},
    )

    run, approval = approve_and_continue(run, reviewer)

    assert run.status == Run.Status.FAILED
    assert run.failure_reason.startswith("the portal refused: ")
    assert "This invoice was already approved by colleague on" in run.failure_reason
    assert approval.refused_at is not None


def test_a_gateway_s_server_error_page_needs_reconciliation_with_its_words(
    operator: User,
    acme_credential: Credential,
    reviewer: User,
    portal: str,
    continuations: list[dict[str, Any]],
) -> None:
    run = lab_run(
        operator,
        portal,
        {"id": "open", "type": "goto", "url": f"{portal}/lab/transfer"},
        {
            "id": "send",
            "type": "click",
            "irreversible": True,
            "target": {"role": "button", "name": "Send transfer"},
            "expect": {"url": "**/transfers/*"},
            "timeout_ms": 3000,
        },
    )

    run, approval = approve_and_continue(run, reviewer)

    # A 503 says the server failed, not that it declined: the words may be a gateway's.
    assert run.status == Run.Status.NEEDS_RECONCILIATION
    assert run.failure_reason == (
        "the approved action was sent and its outcome is unknown: server error: Payment service "
        "unavailable: The bank connection did not answer. Your transfer was not sent; please try "
        f"again later. (HTTP 503 to POST {portal}/lab/transfer) (the browser is at "
        f"{portal}/lab/transfer) — the approved action may have happened; check the portal"
    )
    assert (approval.completed_at, approval.refused_at) == (None, None)


def test_an_outcome_that_never_shows_needs_reconciliation(
    operator: User,
    acme_credential: Credential,
    reviewer: User,
    portal: str,
    continuations: list[dict[str, Any]],
) -> None:
    run = lab_run(
        operator,
        portal,
        {"id": "open", "type": "goto", "url": f"{portal}/lab/approvals/INV-1037"},
        {**APPROVE, "expect": {"text": "Payment scheduled"}, "timeout_ms": 1500},
    )

    run, approval = approve_and_continue(run, reviewer)

    assert run.status == Run.Status.NEEDS_RECONCILIATION
    assert "the portal did not confirm it" in run.failure_reason
    assert "neither the expected outcome (the page shows 'Payment scheduled') nor a refusal" in (
        run.failure_reason
    )
    assert approval.completed_at is None
    assert approval.refused_at is None
    approved = fetch_json(f"{portal}/api/lab")["approvals"]
    assert [a["invoice"] for a in approved] == ["INV-1037"]


def test_a_confirm_accepted_after_approval_performs_the_action_once(
    operator: User,
    acme_credential: Credential,
    reviewer: User,
    portal: str,
    continuations: list[dict[str, Any]],
) -> None:
    run = lab_run(
        operator,
        portal,
        {"id": "open", "type": "goto", "url": f"{portal}/lab/supplier"},
        {
            "id": "remove",
            "type": "click",
            "irreversible": True,
            "dialog": "accept",
            "target": {"role": "button", "name": "Remove supplier"},
            "expect": {"text": "was removed from your suppliers"},
        },
    )
    assert run.approvals.get().evidence["dialog"] == "accept"
    assert fetch_json(f"{portal}/api/lab")["removed_suppliers"] == []

    run, approval = approve_and_continue(run, reviewer)

    assert run.status == Run.Status.SUCCEEDED, run.failure_reason
    assert fetch_json(f"{portal}/api/lab")["removed_suppliers"] == ["Northwind Traders"]
    observation = step(run, "remove").observation
    assert observation is not None
    assert observation["dialogs"] == [{"type": "confirm", "message": CONFIRM, "action": "accepted"}]
    assert f"the confirm dialog said '{CONFIRM}' — accepted" in approval.action_result


def test_a_dialog_the_step_does_not_expect_fails_it_with_its_text(
    operator: User, acme_credential: Credential, portal: str
) -> None:
    run = lab_run(
        operator,
        portal,
        {"id": "open", "type": "goto", "url": f"{portal}/lab/supplier"},
        {"id": "remove", "type": "click", "target": {"role": "button", "name": "Remove supplier"}},
    )

    assert run.status == Run.Status.FAILED
    assert run.failure_step == "remove"
    assert run.failure_reason.startswith(
        f"the page opened a confirm dialog saying '{CONFIRM}', which this step does not expect"
    )
    assert fetch_json(f"{portal}/api/lab")["removed_suppliers"] == []


def test_any_step_that_sees_a_new_refusal_fails_in_the_portals_words(
    operator: User, portal: str
) -> None:
    workflow_services.credential_create(
        user=operator,
        name="wrong-password",
        kind="username_password",
        description="",
        values={"username": "acme-demo", "password": "not-the-password"},
    )

    run = lab_run(
        operator,
        portal,
        {"id": "dashboard", "type": "wait_for", "text": "Open invoices"},
        credential="wrong-password",
    )

    assert run.status == Run.Status.FAILED
    assert run.failure_step == "log-in"
    login = step(run, "log-in")
    assert login.error.startswith("the portal refused: ")
    assert "password" in login.error.lower()
    assert not run.step_results.filter(step_id="dashboard").exists()


def test_a_wait_for_does_not_match_inside_a_refusal_that_appears_while_it_waits(
    operator: User, acme_credential: Credential, portal: str
) -> None:
    # A colleague approved the invoice; the e-mailed request's page still offers the button, and
    # its script shows the portal's refusal a moment after the click.
    fetch_json(f"{portal}/api/lab/approvals/INV-1036", method="POST")

    run = lab_run(
        operator,
        portal,
        {"id": "open", "type": "goto", "url": f"{portal}/lab/approval-request/INV-1036"},
        {
            "id": "approve",
            "type": "click",
            "target": {"role": "button", "name": "Approve INV-1036"},
        },
        {"id": "approved", "type": "wait_for", "text": "approved"},
    )

    assert run.status == Run.Status.FAILED
    assert run.failure_step == "approved"
    assert run.failure_reason.startswith(
        "the portal refused: This invoice was already approved by colleague on"
    )
    approved = fetch_json(f"{portal}/api/lab")["approvals"]
    assert [(a["invoice"], a["by"]) for a in approved] == [("INV-1036", "colleague")]


@pytest.mark.parametrize(
    ("typed", "status", "archived"),
    [("PO-2026-0415", Run.Status.SUCCEEDED, ["PO-2026-0415"]), ("PO-1", Run.Status.FAILED, [])],
)
def test_a_prompt_is_answered_with_the_steps_text(
    operator: User,
    acme_credential: Credential,
    portal: str,
    typed: str,
    status: Run.Status,
    archived: list[str],
) -> None:
    run = lab_run(
        operator,
        portal,
        {"id": "open", "type": "goto", "url": f"{portal}/lab/archive"},
        {
            "id": "archive",
            "type": "click",
            "dialog": "accept",
            "prompt_text": typed,
            "target": {"role": "button", "name": "Archive order"},
        },
    )

    assert run.status == status, run.failure_reason
    assert (step(run, "archive").observation or {})["dialogs"] == [
        {"type": "prompt", "message": "Type the order number to archive it:", "action": "accepted"}
    ]
    assert fetch_json(f"{portal}/api/lab")["archived_orders"] == archived
    if status == Run.Status.FAILED:
        assert run.failure_reason == (
            "the portal refused: The order number does not match; nothing was archived."
        )


def test_a_dismissed_dialog_does_nothing_and_is_recorded(
    operator: User, acme_credential: Credential, portal: str
) -> None:
    run = lab_run(
        operator,
        portal,
        {"id": "open", "type": "goto", "url": f"{portal}/lab/supplier"},
        {
            "id": "keep",
            "type": "click",
            "dialog": "dismiss",
            "target": {"role": "button", "name": "Remove supplier"},
        },
    )

    assert run.status == Run.Status.SUCCEEDED, run.failure_reason
    assert (step(run, "keep").observation or {})["dialogs"] == [
        {"type": "confirm", "message": CONFIRM, "action": "dismissed"}
    ]
    assert fetch_json(f"{portal}/api/lab")["removed_suppliers"] == []


def test_a_menu_with_a_red_item_is_not_a_refusal_but_the_portal_s_new_alert_is(
    operator: User, acme_credential: Credential, portal: str
) -> None:
    run = lab_run(
        operator,
        portal,
        {"id": "open", "type": "goto", "url": f"{portal}/lab/orders"},
        {
            "id": "open-menu",
            "type": "click",
            "target": {"role": "button", "name": "Actions for PO-2026-0415"},
        },
        {"id": "cancel", "type": "click", "target": {"role": "menuitem", "name": "Cancel order"}},
    )

    assert step(run, "open-menu").status == StepResult.Status.SUCCEEDED, run.failure_reason
    assert run.status == Run.Status.FAILED
    assert run.failure_step == "cancel"
    assert run.failure_reason == (
        "the portal refused: Order PO-2026-0415 was delivered on 14 November 2026; "
        "it can no longer be cancelled."
    )


def test_a_page_that_cannot_be_reached_fails_its_goto_with_the_proxy_s_words(
    operator: User,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"
    workflow = publish(
        operator,
        {
            "name": "Closed portal",
            "slug": "closed-portal",
            "settings": {"allowed_hosts": [closed]},
            "steps": [{"id": "open", "type": "goto", "url": f"http://{closed}/invoices"}],
        },
    )
    run = services.run_launch(workflow_id=workflow.pk, user=operator, raw_inputs={})

    execution.run_execute(run_id=run.pk)

    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    assert run.failure_reason.startswith(
        f"http://{closed}/invoices could not be reached: the egress proxy answered HTTP 502: "
        f"could not connect to {closed}: "
    )
