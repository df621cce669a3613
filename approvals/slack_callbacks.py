"""Slack's callbacks: a reviewer's button press or modal submission, verified and turned into a
decision through the one policy place (``approvals.services.approval_decide``). Posting and
updating the cards and questions is ``approvals.slack``'s.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone
from slack_sdk.signature import SignatureVerifier

from approvals import services
from approvals.models import ApprovalDecision, ApprovalRequest
from approvals.passkeys import passkey_required
from approvals.policy import approval_refusal
from approvals.slack import client
from pandaweb.reviewers.models import SlackDelivery, SlackIdentity

logger = logging.getLogger(__name__)

A = ApprovalRequest.Status
REPLAY_WINDOW = timedelta(minutes=10)  # longer than Slack's five-minute timestamp window


class CallbackRefused(Exception):
    """Not a genuine, fresh Slack request."""


def verify_callback(*, body: bytes, headers: dict[str, str]) -> None:
    """Refuse a forged, stale or replayed callback (raises ``CallbackRefused``)."""
    if not settings.SLACK_SIGNING_SECRET:
        raise CallbackRefused("Slack callbacks are not configured (no signing secret)")
    verifier = SignatureVerifier(settings.SLACK_SIGNING_SECRET)
    timestamp = headers.get("X-Slack-Request-Timestamp", "")
    signature = headers.get("X-Slack-Signature", "")
    if not timestamp.isdigit() or not verifier.is_valid(
        body=body, timestamp=timestamp, signature=signature
    ):
        raise CallbackRefused("the request is not signed by Slack, or its timestamp is stale")
    now = timezone.now()
    SlackDelivery.objects.filter(received_at__lt=now - REPLAY_WINDOW).delete()
    try:
        with transaction.atomic():
            SlackDelivery.objects.create(signature=signature)
    except IntegrityError:
        raise CallbackRefused("this request was already received (a replay)") from None


def linked_user(team_id: str, slack_user_id: str) -> User | None:
    identity = (
        SlackIdentity.objects.select_related("user")
        .filter(team_id=team_id, slack_user_id=slack_user_id, user__is_active=True)
        .first()
    )
    return identity.user if identity else None


NOT_LINKED = (
    "Your Slack account is not linked to a pandaweb user, so it cannot decide. In pandaweb, open "
    "your profile, get a link code and send `/pandaweb link CODE` here."
)


def _ephemeral(channel: str, user: str, text: str) -> None:
    try:
        client().chat_postEphemeral(channel=channel, user=user, text=text)
    except Exception:
        logger.exception("could not answer Slack user %s", user)


def _decide(
    *, user: User, value: dict[str, Any], approve: bool, reason: str = ""
) -> tuple[bool, str]:
    """Decide through the one policy place; (recorded?, the sentence for the reviewer)."""
    try:
        approval_id, evidence = int(value["a"]), str(value["h"])
    except (KeyError, TypeError, ValueError):
        return False, "Not recorded: this button is malformed."
    link = f"{settings.PANDAWEB_BASE_URL}/approvals/{approval_id}/"
    try:
        decided = services.approval_decide(
            approval_id=approval_id,
            user=user,
            approve=approve,
            reason=reason,
            evidence_sha256=evidence,
        )
    except ApprovalRequest.DoesNotExist:
        return False, "Not recorded: this request does not exist."
    except services.ApprovalRefused as refused:
        return False, f"Not recorded. {_sentence(str(refused))} <{link}|Open the request>"
    return True, _outcome_sentence(decided, approve=approve)


def _sentence(text: str) -> str:
    text = text.strip()
    text = text[:1].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else f"{text}."


def _outcome_sentence(approval: ApprovalRequest, *, approve: bool) -> str:
    if approval.status == A.APPROVED:
        return f"Approved. Run #{approval.run_id} continues with the action."
    if approval.status == A.REJECTED:
        return f"Rejected. Run #{approval.run_id} is cancelled; nothing was submitted."
    if approve:
        given = approval.decisions.filter(verdict=ApprovalDecision.Verdict.APPROVE).count()
        return f"Your approval is recorded ({given} of {approval.quorum}); waiting for the others."
    return "Your decision is recorded."


def handle_block_action(payload: dict[str, Any]) -> None:
    """Approve at once; Reject opens a modal asking for the reason."""
    slack_user = payload.get("user") or {}
    team_id = str(slack_user.get("team_id") or (payload.get("team") or {}).get("id") or "")
    slack_user_id = str(slack_user.get("id") or "")
    channel = str((payload.get("channel") or {}).get("id") or "")
    actions = payload.get("actions") or []
    if not actions or actions[0].get("action_id") not in ("approve", "reject"):
        return  # the "Open" link button also reports a click; nothing to do
    action = actions[0]
    user = linked_user(team_id, slack_user_id)
    if user is None:
        _ephemeral(channel, slack_user_id, NOT_LINKED)
        return
    try:
        value = json.loads(action.get("value") or "")
    except ValueError:
        _ephemeral(channel, slack_user_id, "Not recorded: this button is malformed.")
        return
    if action["action_id"] == "approve":
        _, sentence = _decide(user=user, value=value, approve=True)
        _ephemeral(channel, slack_user_id, sentence)
        return
    refusal = _early_refusal(user, value)
    if refusal:
        _ephemeral(channel, slack_user_id, refusal)
        return
    client().views_open(
        trigger_id=str(payload.get("trigger_id") or ""),
        view={
            "type": "modal",
            "callback_id": "reject_reason",
            "private_metadata": json.dumps({**value, "c": channel}),
            "title": {"type": "plain_text", "text": "Reject the request"},
            "submit": {"type": "plain_text", "text": "Reject"},
            "close": {"type": "plain_text", "text": "Cancel"},
            "blocks": [
                {
                    "type": "input",
                    "block_id": "reason",
                    "label": {"type": "plain_text", "text": "Why do you reject this action?"},
                    "element": {
                        "type": "plain_text_input",
                        "action_id": "reason",
                        "multiline": True,
                    },
                }
            ],
        },
    )


def _early_refusal(user: User, value: dict[str, Any]) -> str:
    """Refusals worth saying before asking for a reason (``approval_decide`` checks them all
    again when the reason comes)."""
    try:
        approval = ApprovalRequest.objects.filter(pk=int(value.get("a") or 0)).first()
    except (TypeError, ValueError):
        approval = None
    if approval is None:
        return "Not recorded: this request does not exist."
    link = f"{settings.PANDAWEB_BASE_URL}/approvals/{approval.pk}/"
    refusal = approval_refusal(user, approval)
    if refusal is None and approval.status != A.PENDING:
        refusal = f"this request is already {approval.get_status_display().lower()}"
    if refusal is None and approval.expires_at <= timezone.now():
        refusal = "this request is already expired"
    if refusal is None and passkey_required(approval):
        refusal = "this request needs your passkey: decide on the approval page"
    return f"Not recorded. {_sentence(refusal)} <{link}|Open the request>" if refusal else ""


def handle_view_submission(payload: dict[str, Any]) -> dict[str, Any] | None:
    """The reject modal's reason: the verdict, or the refusal shown inside the modal."""
    view = payload.get("view") or {}
    if view.get("callback_id") != "reject_reason":
        return None
    slack_user = payload.get("user") or {}
    team_id = str(slack_user.get("team_id") or (payload.get("team") or {}).get("id") or "")
    slack_user_id = str(slack_user.get("id") or "")
    user = linked_user(team_id, slack_user_id)
    if user is None:
        return {"response_action": "errors", "errors": {"reason": NOT_LINKED}}
    try:
        value = json.loads(view.get("private_metadata") or "")
        reason = str(view["state"]["values"]["reason"]["reason"]["value"] or "")
    except (ValueError, KeyError, TypeError):
        return {"response_action": "errors", "errors": {"reason": "Malformed form."}}
    recorded, sentence = _decide(user=user, value=value, approve=False, reason=reason)
    if not recorded:
        return {"response_action": "errors", "errors": {"reason": sentence[:150]}}
    if value.get("c"):
        _ephemeral(str(value["c"]), slack_user_id, sentence)
    return None
