"""The reviewer's pages: the queue, the decision page and its approve / reject posts (plain and
htmx), with the policy of approvals.services behind them. Runs are made without a browser: a
launched run is put straight into "awaiting approval" with a request of hand-made evidence."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.http import HttpResponse
from django.test import Client
from django.utils import timezone
from django.utils.html import escape

from approvals.models import ApprovalDecision, ApprovalRequest
from approvals.services import evidence_hash
from approvals.templatetags.approval_expiry import countdown_text
from pandaweb.core.roles import Role
from sessions import services
from sessions.models import Run
from tests.factories import user_with_role
from workflows.models import Workflow

pytestmark = [pytest.mark.usefixtures("run_files_in_tmp"), pytest.mark.django_db]

PAY_URL = "http://127.0.0.1:8001/invoices/INV-1009/pay"
IBAN = "DE89 3704 0044 0532 0130 00"
INPUTS = {"invoice": "INV-1009", "amount": "547.70", "iban": IBAN}


def evidence(**changes: Any) -> dict[str, Any]:
    """What the runner freezes in front of the demo workflow's payment click."""
    return {
        "step_index": 13,
        "step_id": "submit-payment",
        "action": f"Click the button 'Submit payment' on {PAY_URL}",
        "url": PAY_URL,
        "title": "Pay INV-1009 · Acme Supplier Portal",
        "target": {
            "description": "the button 'Submit payment'",
            "tag": "button",
            "id": "submit-payment",
            "name": "",
            "type": "submit",
            "text": "Submit payment",
            "form_action": PAY_URL,
            "box": {"x": 40, "y": 420, "width": 160, "height": 36},
        },
        "filled": [
            {
                "step_id": "fill-amount",
                "field": "the field labelled 'Amount'",
                "url": PAY_URL,
                "value": "547.70",
                "secret": False,
                "on_page": "547.70",
            },
            {
                "step_id": "fill-iban",
                "field": "the field labelled 'IBAN'",
                "url": PAY_URL,
                "value": IBAN,
                "secret": False,
                "on_page": IBAN,
            },
        ],
        "inputs": INPUTS,
        "outputs": {"total": "547.70"},
        "page_text": "Pay invoice INV-1009 Amount 547.70 IBAN … Submit payment",
        "observation": {
            "url": PAY_URL,
            "title": "Pay INV-1009",
            "text": '- heading "Pay invoice INV-1009"\n[1] button "Submit payment"',
            "size_chars": 52,
            "token_estimate": 13,
            "omitted": 0,
            "elements": [],
        },
        "changes": [],
        "screenshot_sha256": "a" * 64,
        "outlined_sha256": "b" * 64,
        **changes,
    }


@pytest.fixture
def requester(db: None) -> User:
    """Launches the run, and happens to be a reviewer too: the four-eyes rule still applies."""
    user = user_with_role(Role.OPERATORS, username="olga")
    user.groups.add(Group.objects.get(name=Role.REVIEWERS.value))
    return user


def waiting_run(workflow: Workflow, user: User) -> Run:
    run = services.run_launch(workflow_id=workflow.pk, user=user, raw_inputs=INPUTS)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.AWAITING_APPROVAL)
    run.refresh_from_db()
    return run


def request_for(run: Run, **fields: Any) -> ApprovalRequest:
    sealed = fields.pop("evidence", None) or evidence()
    return ApprovalRequest.objects.create(
        run=run,
        step_index=sealed["step_index"],
        step_id=sealed["step_id"],
        action=sealed["action"],
        evidence=sealed,
        evidence_sha256=evidence_hash(sealed),
        screenshot="approvals/01-submit-payment.png",
        outlined="approvals/01-submit-payment.outlined.png",
        expires_at=timezone.now() + timedelta(minutes=53, seconds=30),
        **fields,
    )


@pytest.fixture
def approval(demo_workflow: Workflow, requester: User) -> ApprovalRequest:
    return request_for(waiting_run(demo_workflow, requester))


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def decide(
    client: Client, approval: ApprovalRequest, *, htmx: bool = False, **data: str
) -> HttpResponse:
    return client.post(  # type: ignore[return-value]
        f"/approvals/{approval.pk}/decide/",
        {"evidence_sha256": approval.evidence_sha256, **data},
        headers={"HX-Request": "true"} if htmx else None,
    )


def run_status(approval: ApprovalRequest) -> str:
    return Run.objects.values_list("status", flat=True).get(approvals=approval)


def assert_unchanged(approval: ApprovalRequest, continuations: list[dict[str, Any]]) -> None:
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING
    assert not approval.decisions.exists()
    assert approval.run is not None
    approval.run.refresh_from_db()
    assert approval.run.status == Run.Status.AWAITING_APPROVAL
    assert continuations == []


# The queue ---------------------------------------------------------------------------------------


def test_the_queue_lists_pending_requests_oldest_first(
    demo_workflow: Workflow, requester: User, reviewer: User
) -> None:
    now = timezone.now()
    newer = request_for(waiting_run(demo_workflow, requester))
    older = request_for(waiting_run(demo_workflow, requester))
    ApprovalRequest.objects.filter(pk=older.pk).update(created_at=now - timedelta(minutes=20))
    ApprovalRequest.objects.filter(pk=newer.pk).update(created_at=now - timedelta(minutes=5))
    done = request_for(
        waiting_run(demo_workflow, requester), status=ApprovalRequest.Status.APPROVED
    )
    client = client_for(reviewer)

    body = client.get("/approvals/").content.decode()

    assert body.index(f'href="/approvals/{older.pk}/"') < body.index(
        f'href="/approvals/{newer.pk}/"'
    )
    assert f'href="/approvals/{done.pk}/"' not in body
    assert f"#{older.run_id}" in body
    assert "olga" in body  # who launched the run
    assert "Click the button &#x27;Submit payment&#x27;" in body
    assert "Pay an Acme invoice" in body
    assert "expires in 53 min" in body
    assert 'data-expires-in="' in body
    assert "pandaweb/countdown.js" in body

    everything = client.get("/approvals/?status=all").content.decode()
    assert f'href="/approvals/{done.pk}/"' in everything
    other = client.get("/approvals/?workflow=someone-else").content.decode()
    assert f'href="/approvals/{older.pk}/"' not in other
    assert "Nothing is waiting for approval for this workflow." in other
    # htmx (the filter form, a badge change) gets the table alone.
    partial = client.get("/approvals/?status=all", headers={"HX-Request": "true"}).content.decode()
    assert partial.lstrip().startswith('<div id="queue"')
    assert f'href="/approvals/{done.pk}/"' in partial


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(0, "expired"), (42, "expires in 42 s"), (53 * 60 + 59, "expires in 53 min"),
     (3600 + 5 * 60, "expires in 1 h 05 min"), (2 * 86400 + 3 * 3600, "expires in 2 d 3 h")],
)  # fmt: skip
def test_the_countdown_words(seconds: int, words: str) -> None:
    assert countdown_text(seconds) == words


# The decision page -------------------------------------------------------------------------------


def test_the_decision_page_shows_the_action_the_typed_values_and_their_sources(
    approval: ApprovalRequest, reviewer: User
) -> None:
    response = client_for(reviewer).get(f"/approvals/{approval.pk}/")

    body = response.content.decode()
    assert response.status_code == 200
    # The headline names the page by its host; its whole address is under the picture.
    action = escape(approval.action_summary)
    assert action.endswith(" on 127.0.0.1:8001")
    assert f'<h1 id="action-heading" class="approval-action">{action}</h1>' in body
    assert f'<a href="{escape(approval.evidence["url"])}" rel="noreferrer noopener">' in body
    assert f'src="/runs/{approval.run_id}/files/approvals/01-submit-payment.outlined.png"' in body
    # The typed values, each next to the input or output that holds the same value.
    assert "The field labelled &#x27;Amount&#x27;" in body
    assert '<strong class="mono">547.70</strong>' in body
    assert f'<strong class="mono">{IBAN}</strong>' in body
    assert "input Amount to pay" in body
    assert "output total" in body
    assert "input Beneficiary IBAN" in body
    assert "INV-1009" in body
    assert "EUR" in body
    # What the robot saw, the evidence hash, the expiry, and the buttons.
    assert '<details class="approval-observation">' in body
    assert "heading &quot;Pay invoice INV-1009&quot;" in body
    assert approval.evidence_sha256 in body
    assert "expires in 53 min" in body
    assert f'name="evidence_sha256" value="{approval.evidence_sha256}"' in body
    assert "Approve this action" in body
    assert 'name="reason"' in body
    assert "Waiting for this approval" in body


def test_a_repeated_request_says_what_changed_on_the_page(
    demo_workflow: Workflow, requester: User, reviewer: User
) -> None:
    run = waiting_run(demo_workflow, requester)
    first = request_for(run, status=ApprovalRequest.Status.VOIDED)
    changed = "the field labelled 'IBAN' now holds 'DE00 0000', not 'DE89 3704'"
    second = request_for(run, previous=first, evidence=evidence(changes=[changed]))
    client = client_for(reviewer)

    body = client.get(f"/approvals/{second.pk}/").content.decode()
    assert "The page changed since approval." in body
    assert f'href="/approvals/{first.pk}/"' in body
    assert "now holds &#x27;DE00 0000&#x27;" in body
    old = client.get(f"/approvals/{first.pk}/").content.decode()
    assert f'Asked again as <a href="/approvals/{second.pk}/">' in old
    assert "Approve this action" not in old


def test_the_requester_sees_why_instead_of_the_buttons(
    approval: ApprovalRequest, requester: User
) -> None:
    body = client_for(requester).get(f"/approvals/{approval.pk}/").content.decode()

    assert "You launched this run: someone else has to approve it." in body
    assert "Approve this action" not in body


# Deciding ----------------------------------------------------------------------------------------


def test_an_allowed_reviewer_approves_and_the_run_continues(
    approval: ApprovalRequest, reviewer: User, continuations: list[dict[str, Any]]
) -> None:
    client = client_for(reviewer)

    response = decide(client, approval, verdict="approve")

    assert response.status_code == 302
    assert response["Location"] == f"/approvals/{approval.pk}/"
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.APPROVED
    assert approval.decisions.get().reviewer == reviewer
    assert continuations == [
        {
            "task": "runs.continue",
            "queue": None,
            "run_id": approval.run_id,
            "approval_id": approval.pk,
        }
    ]
    assert run_status(approval) == Run.Status.RUNNING
    page = client.get(response["Location"]).content.decode()
    assert f"Approved. Run #{approval.run_id} continues with the action." in page
    assert "Approve this action" not in page
    assert 'rory</strong> <span class="verdict">approved</span>' in page


def test_an_htmx_approval_swaps_the_decision_panel(
    approval: ApprovalRequest, reviewer: User, continuations: list[dict[str, Any]]
) -> None:
    response = decide(client_for(reviewer), approval, verdict="approve", htmx=True)

    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<section id="decision-panel"')
    assert "<html" not in body
    assert "Approved. Run #" in body
    assert '<span class="status status-approved">Approved</span>' in body
    # The run's status in the page head follows, out of band.
    assert 'id="approval-run-status" class="status status-running" hx-swap-oob="true"' in body
    assert len(continuations) == 1


@pytest.mark.parametrize("htmx", [False, True], ids=["plain", "htmx"])
def test_the_requester_cannot_approve_their_own_run(
    htmx: bool,
    approval: ApprovalRequest,
    requester: User,
    continuations: list[dict[str, Any]],
) -> None:
    client = client_for(requester)
    message = "You launched this run: someone else has to approve it."

    if htmx:
        response = decide(client, approval, verdict="approve", htmx=True)
        assert response.status_code == 200
        body = response.content.decode()
        assert body.lstrip().startswith('<section id="decision-panel"')
        assert f'<p class="message message-error" role="alert">{message}</p>' in body
    else:
        response = decide(client, approval, verdict="approve")
        assert response.status_code == 302
        page = client.get(response["Location"]).content.decode()
        assert f"Not recorded. {message}" in page
        assert "message-error" in page
    assert_unchanged(approval, continuations)


def test_a_reviewer_outside_the_workflows_group_is_refused(
    demo_workflow: Workflow,
    requester: User,
    reviewer: User,
    continuations: list[dict[str, Any]],
) -> None:
    Group.objects.create(name="Payments")
    approval = request_for(waiting_run(demo_workflow, requester), reviewer_group="Payments")
    client = client_for(reviewer)

    page = client.get(f"/approvals/{approval.pk}/").content.decode()
    assert "Only members of Payments decide this workflow&#x27;s approvals." in page
    assert "Approve this action" not in page
    response = decide(client, approval, verdict="approve", htmx=True)

    assert response.status_code == 200
    assert "Only members of Payments decide" in response.content.decode()
    assert_unchanged(approval, continuations)


def test_a_rejection_needs_a_reason(
    approval: ApprovalRequest, reviewer: User, continuations: list[dict[str, Any]]
) -> None:
    client = client_for(reviewer)

    partial = decide(client, approval, verdict="reject", reason="  ", htmx=True)
    plain = decide(client, approval, verdict="reject", reason="")

    for response in (partial, plain):
        body = response.content.decode()
        assert response.status_code == 200
        assert 'class="field has-error"' in body
        assert (
            '<p class="field-error" id="reject-reason-error" role="alert">'
            "Say why you reject this action.</p>"
        ) in body
        assert "A rejection needs a reason." in body
    assert "<html" not in partial.content.decode()
    assert "<html" in plain.content.decode()  # the whole page again, like an invalid form
    assert_unchanged(approval, continuations)


def test_a_rejection_with_a_reason_cancels_the_run(
    approval: ApprovalRequest, reviewer: User, continuations: list[dict[str, Any]]
) -> None:
    client = client_for(reviewer)

    response = decide(client, approval, verdict="reject", reason="IBAN is not Acme's")

    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.REJECTED
    decision = approval.decisions.get()
    assert (decision.verdict, decision.reason) == (
        ApprovalDecision.Verdict.REJECT,
        "IBAN is not Acme's",
    )
    assert run_status(approval) == Run.Status.CANCELLED
    assert continuations == []
    page = client.get(response["Location"]).content.decode()
    assert "nothing was submitted" in page
    assert "<q>IBAN is not Acme&#x27;s</q>" in page


def test_a_decision_on_other_evidence_is_refused(
    approval: ApprovalRequest, reviewer: User, continuations: list[dict[str, Any]]
) -> None:
    response = client_for(reviewer).post(
        f"/approvals/{approval.pk}/decide/",
        {"verdict": "approve", "evidence_sha256": "0" * 64},
        headers={"HX-Request": "true"},
    )

    assert "The evidence changed since you opened it: look again." in response.content.decode()
    assert_unchanged(approval, continuations)


def test_a_late_verdict_is_refused_and_closes_the_request(
    demo_workflow: Workflow,
    requester: User,
    reviewer: User,
    continuations: list[dict[str, Any]],
) -> None:
    approval = request_for(waiting_run(demo_workflow, requester))
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        expires_at=timezone.now() - timedelta(seconds=5)
    )
    client = client_for(reviewer)
    page = client.get(f"/approvals/{approval.pk}/").content.decode()
    assert "The deadline has passed." in page
    assert "Approve this action" not in page

    response = decide(client, approval, verdict="approve", htmx=True)

    body = response.content.decode()
    assert response.status_code == 200
    assert "This request is already expired." in body
    assert '<span class="status status-expired">Expired</span>' in body
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.EXPIRED
    assert not approval.decisions.exists()
    assert run_status(approval) == Run.Status.CANCELLED
    assert continuations == []


def test_a_verdict_must_be_approve_or_reject(
    approval: ApprovalRequest, reviewer: User, continuations: list[dict[str, Any]]
) -> None:
    assert decide(client_for(reviewer), approval, verdict="maybe").status_code == 400
    assert_unchanged(approval, continuations)


# Who may --------------------------------------------------------------------------------------


def test_operators_without_the_capability_get_403(
    approval: ApprovalRequest, operator: User, continuations: list[dict[str, Any]]
) -> None:
    client = client_for(operator)

    assert client.get("/approvals/").status_code == 403
    assert client.get(f"/approvals/{approval.pk}/").status_code == 403
    assert decide(client, approval, verdict="approve").status_code == 403
    assert_unchanged(approval, continuations)


def test_the_launcher_watches_their_own_request_but_cannot_decide_it(
    demo_workflow: Workflow,
    operator: User,
    reviewer: User,
    continuations: list[dict[str, Any]],
) -> None:
    launcher = operator  # an operator: no approvals queue, no say in decisions
    colleague = user_with_role(Role.OPERATORS, username="oscar")
    stranger = user_with_role(None, username="stan")
    approval = request_for(waiting_run(demo_workflow, launcher))
    mine = client_for(launcher)

    run_page = mine.get(f"/runs/{approval.run_id}/").content.decode()
    assert f'<a href="/approvals/{approval.pk}/">request #{approval.pk}</a>' in run_page
    response = mine.get(f"/approvals/{approval.pk}/")
    body = response.content.decode()
    assert response.status_code == 200
    assert escape(approval.action) in body
    assert "You launched this run: someone else has to approve it." in body
    assert "Approve this action" not in body
    assert 'name="verdict"' not in body
    assert 'href="/approvals/"' not in body  # the queue would refuse them
    assert mine.get("/approvals/").status_code == 403
    assert decide(mine, approval, verdict="approve").status_code == 403
    assert decide(mine, approval, verdict="reject", reason="mine").status_code == 403
    # A colleague who did not launch it, and a stranger, are still refused.
    other = client_for(colleague)
    assert other.get(f"/approvals/{approval.pk}/").status_code == 403
    other_page = other.get(f"/runs/{approval.run_id}/").content.decode()
    assert f"request #{approval.pk}" in other_page
    assert f'href="/approvals/{approval.pk}/"' not in other_page
    assert client_for(stranger).get(f"/approvals/{approval.pk}/").status_code == 403
    assert_unchanged(approval, continuations)
    # The reviewer still decides as before.
    decider = client_for(reviewer).get(f"/approvals/{approval.pk}/").content.decode()
    assert "Approve this action" in decider


def test_compliance_reads_but_cannot_decide(
    approval: ApprovalRequest, continuations: list[dict[str, Any]]
) -> None:
    client = client_for(user_with_role(Role.COMPLIANCE))

    assert client.get("/approvals/").status_code == 200
    page = client.get(f"/approvals/{approval.pk}/").content.decode()
    assert "You are not allowed to decide approvals." in page
    assert decide(client, approval, verdict="approve").status_code == 403
    assert_unchanged(approval, continuations)


def test_an_unknown_request_is_404(reviewer: User) -> None:
    client = client_for(reviewer)

    assert client.get("/approvals/999999/").status_code == 404
    assert client.post("/approvals/999999/decide/", {"verdict": "approve"}).status_code == 404


def test_people_who_may_be_asked_or_see_approvals_get_the_toast_and_others_do_not(
    reviewer: User, operator: User
) -> None:
    assert 'id="needs-toast"' in client_for(reviewer).get("/").content.decode()
    # An operator does not see the queue, but the runs they launch may ask them something.
    assert 'id="needs-toast"' in client_for(operator).get("/").content.decode()
    nobody = user_with_role(None, username="sam")
    assert 'id="needs-toast"' not in client_for(nobody).get("/").content.decode()
