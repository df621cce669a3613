"""The decision page's phone-first parts (the close-up of the target, the bar and the sheet),
its comments and hand-over forms, and the profile page's out-of-office, over plain posts."""

from __future__ import annotations

import io
from datetime import date

import pytest
from django.contrib.auth.models import User
from PIL import Image

from approvals.models import ApprovalComment, ApprovalRequest, ReviewerAbsence
from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from sessions.services import run_files_dir
from tests.approvals.test_views import approval, client_for, requester
from tests.factories import user_with_role

__all__ = ["approval", "requester"]

pytestmark = [pytest.mark.usefixtures("run_files_in_tmp"), pytest.mark.django_db]


@pytest.fixture
def stranger(db: None) -> User:
    return user_with_role(Role.OPERATORS, username="sam")


def picture(path: str, approval: ApprovalRequest) -> None:
    target = run_files_dir(approval.run_id) / path
    target.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (1280, 800), (250, 250, 250)).save(target, format="PNG")


def test_the_page_shows_a_close_up_of_the_target_cut_once_beside_the_pictures(
    approval: ApprovalRequest, reviewer: User
) -> None:
    picture(approval.outlined, approval)
    client = client_for(reviewer)

    body = client.get(f"/approvals/{approval.pk}/").content.decode()
    crop_url = f"/runs/{approval.run_id}/files/approvals/01-submit-payment.target.png"
    assert f'<a href="{crop_url}" class="zoom"' in body
    cropped = run_files_dir(approval.run_id) / "approvals/01-submit-payment.target.png"
    # The box is 160x36 at (40, 420): a margin around it, kept inside the 1280x800 picture.
    assert Image.open(io.BytesIO(cropped.read_bytes())).size == (480, 240)
    mtime = cropped.stat().st_mtime_ns
    client.get(f"/approvals/{approval.pk}/")
    assert cropped.stat().st_mtime_ns == mtime
    assert client.get(crop_url).status_code == 200


def test_the_page_has_the_decision_bar_and_a_reject_sheet_without_javascript(
    approval: ApprovalRequest, reviewer: User
) -> None:
    body = client_for(reviewer).get(f"/approvals/{approval.pk}/").content.decode()
    assert '<div class="decide-bar">' in body
    assert '<a href="#reject-sheet" class="button danger reject-open">Reject…</a>' in body
    assert 'id="reject-sheet" class="decide-form reject-form"' in body
    # The timeline is folded below the decision, and the amount is up in the head.
    assert body.index('id="decision-panel"') < body.index('<details class="approval-timeline"')
    facts = body.index('<dl class="decision-facts decision-facts-large">')
    assert facts < body.index('id="decision-panel"')
    assert "<dt>Amount</dt><dd><strong>547.70 EUR</strong></dd>" in body[facts:]


def test_a_rejection_without_a_reason_opens_the_sheet_again(
    approval: ApprovalRequest, reviewer: User
) -> None:
    response = client_for(reviewer).post(
        f"/approvals/{approval.pk}/decide/",
        {"evidence_sha256": approval.evidence_sha256, "verdict": "reject", "reason": ""},
    )
    assert 'class="decide-form reject-form sheet-open"' in response.content.decode()
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING


def test_a_comment_posted_on_the_page_shows_in_its_timeline(
    approval: ApprovalRequest, reviewer: User, stranger: User
) -> None:
    client = client_for(reviewer)
    response = client.post(f"/approvals/{approval.pk}/comment/", {"body": "Checked the IBAN"})
    assert response.status_code == 302
    assert response["Location"] == f"/approvals/{approval.pk}/#comments"
    colleague = user_with_role(Role.REVIEWERS, username="cora")
    client.post(f"/approvals/{approval.pk}/reassign/", {"to": f"user:{colleague.pk}"})
    body = client.get(f"/approvals/{approval.pk}/").content.decode()
    # The comment and the hand-over, in the request's history, in the order they happened.
    comment = body.index("<strong>rory</strong> commented:<p>Checked the IBAN</p>")
    assert comment < body.index("<strong>rory</strong> handed it to cora.")
    assert client_for(stranger).post(
        f"/approvals/{approval.pk}/comment/", {"body": "me too"}
    ).status_code in (403, 404)
    assert list(ApprovalComment.objects.values_list("body", flat=True)) == ["Checked the IBAN"]
    assert AuditEvent.objects.filter(action="approval.commented").count() == 1


def test_the_hand_over_form_offers_only_who_may_decide_and_hands_over(
    approval: ApprovalRequest, reviewer: User, requester: User
) -> None:
    colleague = user_with_role(Role.REVIEWERS, username="cora")
    client = client_for(reviewer)
    body = client.get(f"/approvals/{approval.pk}/").content.decode()
    assert f'<option value="user:{colleague.pk}">cora</option>' in body
    assert f'value="user:{requester.pk}"' not in body  # the launcher never decides
    assert f'value="user:{reviewer.pk}"' not in body

    response = client.post(f"/approvals/{approval.pk}/reassign/", {"to": f"user:{colleague.pk}"})
    assert response.status_code == 302
    approval.refresh_from_db()
    assert approval.assignee == colleague
    assert "handed to cora" in client.get(f"/approvals/{approval.pk}/").content.decode()

    client.post(f"/approvals/{approval.pk}/reassign/", {"to": f"user:{requester.pk}"})
    approval.refresh_from_db()
    assert approval.assignee == colleague


def test_the_profile_page_sets_and_clears_an_out_of_office(reviewer: User) -> None:
    client = client_for(reviewer)
    assert "Out of office" in client.get("/profile/").content.decode()
    response = client.post("/profile/", {"away_from": "2026-12-20", "away_until": "2026-12-31"})
    assert response.status_code == 302
    absence = ReviewerAbsence.objects.get(user=reviewer)
    assert (absence.away_from, absence.away_until) == (date(2026, 12, 20), date(2026, 12, 31))

    refused = client.post("/profile/", {"away_from": "2026-12-20", "away_until": ""})
    assert "Give both dates" in refused.content.decode()
    client.post("/profile/", {"away_from": "", "away_until": ""})
    assert not ReviewerAbsence.objects.filter(user=reviewer).exists()


def test_the_navigation_links_to_the_profile_and_keeps_log_out(reviewer: User) -> None:
    body = client_for(reviewer).get("/approvals/").content.decode()
    assert 'href="/profile/"' in body
    assert "Log out" in body


def test_a_fact_the_page_does_not_show_or_states_differently_is_a_warning_beside_it(
    approval: ApprovalRequest, reviewer: User
) -> None:
    approval.evidence = {
        **approval.evidence,
        "facts": [
            {"fact": "amount", "name": "charged", "source": "output", "value": "9999.00",
             "currency": "EUR", "on_page": True, "read_earlier": "547.70"},
            {"fact": "payee", "name": "iban", "source": "input", "value": "DE97 2004",
             "currency": "", "on_page": False},
            {"fact": "reference", "name": "invoice", "source": "input", "value": "INV-1040",
             "currency": "", "on_page": True},
        ],
    }  # fmt: skip
    approval.save(update_fields=["evidence"])

    body = client_for(reviewer).get(f"/approvals/{approval.pk}/").content.decode()
    queue = client_for(reviewer).get("/approvals/").content.decode()

    for page in (body, queue):
        assert "<strong>9,999.00 EUR</strong>" in page
        assert "The page now shows 9999.00; the run read 547.70 earlier." in page
        assert "The page does not show this payee." in page
        assert page.count('class="fact-warning"') == 2
