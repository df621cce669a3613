"""Chat approvals in Slack: a card per request, its buttons decided through ``approval_decide``;
and a run's questions, posted with a link to answer them on the run page.

Cards are posted (and later updated with the outcome) through ``slack_sdk``'s ``WebClient`` at
``PANDAWEB_SLACK_API_URL``. Callbacks arrive signed by Slack; the signature and timestamp are
checked, an exact replay is refused, and the clicking Slack user is mapped to a pandaweb user
only through a linked identity (team id + user id). The verdict carries the evidence hash the
card showed, so a card for old evidence cannot approve new evidence.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core import signing
from django.utils import timezone
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from approvals.closeup import approval_target_crop
from approvals.facts import approval_facts, facts_line
from approvals.models import ApprovalDecision, ApprovalRequest, Question
from approvals.passkeys import passkey_required
from pandaweb.reviewers.models import (
    SlackCard,
    SlackQuestionMessage,
)
from sessions.engine.steps.ask import ASK_LAUNCHER
from sessions.services.runstate import run_files_dir

logger = logging.getLogger(__name__)

A = ApprovalRequest.Status
IMAGE_SALT = "approvals.slack.card-image"


def client() -> WebClient:
    return WebClient(token=settings.SLACK_BOT_TOKEN, base_url=settings.SLACK_API_URL, timeout=5)


# The card ----------------------------------------------------------------------------------------


def card_image_url(approval: ApprovalRequest) -> str:
    """A link Slack can fetch without a session: signed, expiring after
    ``PANDAWEB_SLACK_IMAGE_LINK_MINUTES``."""
    token = signing.dumps(approval.pk, salt=IMAGE_SALT, compress=True)
    return f"{settings.PANDAWEB_BASE_URL}/integrations/slack/card-image/{token}.png"


def card_image_approval(token: str) -> int | None:
    try:
        return int(
            signing.loads(token, salt=IMAGE_SALT, max_age=settings.SLACK_IMAGE_LINK_MINUTES * 60)
        )
    except (signing.BadSignature, ValueError, TypeError):
        return None


def card_image(approval: ApprovalRequest) -> bytes:
    """The close-up the decision page shows first (the target with its dialog or form), or the
    outlined picture where there is no target to cut around (PNG)."""
    root = Path(run_files_dir(approval.run_id))
    crop = approval_target_crop(approval)
    return (root / (crop or approval.outlined or approval.screenshot)).read_bytes()


def _fact_fields(approval: ApprovalRequest) -> list[dict[str, str]]:
    """The facts a reviewer decides on, each with the page's disagreement where there is one."""
    fields = []
    for fact in approval_facts(approval):
        text = f"*{fact.label}*\n{_escape(fact.text)}"
        if fact.warning:
            text += f"\n:warning: {_escape(fact.warning)}"
        fields.append({"type": "mrkdwn", "text": text})
    return fields


def card_state(approval: ApprovalRequest) -> str:
    """What the card shows, in one string: an update is sent only when it changes."""
    approvals = sum(
        1 for d in approval.decisions.all() if d.verdict == ApprovalDecision.Verdict.APPROVE
    )
    state = f"{approval.status}:{approvals}"
    if approval.status == A.PENDING:
        state += ":reminded" if approval.reminded_at else ""
        state += f":escalated:{approval.escalation_group}" if approval.escalated_at else ""
    return state


def card_blocks(approval: ApprovalRequest) -> tuple[str, list[dict[str, Any]]]:
    """The fallback text and Block Kit blocks of ``approval``'s card, as it stands now."""

    run = approval.run
    link = f"{settings.PANDAWEB_BASE_URL}/approvals/{approval.pk}/"
    expires = int(approval.expires_at.timestamp())
    title = f"Approval needed: {run.workflow.name} (run #{run.pk})"
    facts = facts_line(approval)
    fallback = f"{title}: {facts} — {approval.action}" if facts else f"{title}: {approval.action}"
    target = (approval.evidence or {}).get("target") or {}
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title[:150]}},
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*{_escape(approval.action)}*"}},
        {
            "type": "section",
            "fields": [
                *_fact_fields(approval),
                {
                    "type": "mrkdwn",
                    "text": f"*Launched by*\n{_escape(run.launched_by.get_username())}",
                },
                {
                    "type": "mrkdwn",
                    "text": f"*Expires*\n<!date^{expires}^{{date_short_pretty}} {{time}}|"
                    f"{approval.expires_at:%Y-%m-%d %H:%M} UTC>",
                },
                {"type": "mrkdwn", "text": f"*Quorum*\n{approval.quorum}"},
            ],
        },
    ]
    if approval.outlined or approval.screenshot:
        blocks.append(
            {
                "type": "image",
                "image_url": card_image_url(approval),
                "alt_text": (str(target.get("description") or "the target of the action"))[:200],
            }
        )
    decisions = list(approval.decisions.select_related("reviewer"))
    approved_by = [
        d.reviewer.get_username()
        for d in decisions
        if d.verdict == ApprovalDecision.Verdict.APPROVE
    ]
    context = f"Evidence `{approval.evidence_sha256[:12]}` · <{link}|Open in pandaweb>"
    if approval.status == A.PENDING:
        if approved_by:
            context += (
                f" · approved by {', '.join(approved_by)} ({len(approved_by)} of {approval.quorum})"
            )
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
        if passkey_required(approval):
            blocks.append(
                {
                    "type": "section",
                    "text": {
                        "type": "mrkdwn",
                        "text": "This request needs a passkey: decide on the page.",
                    },
                }
            )
            blocks.append(
                {
                    "type": "actions",
                    "block_id": "decide",
                    "elements": [_link_button("Decide in pandaweb", link, "open")],
                }
            )
        else:
            value = json.dumps({"a": approval.pk, "h": approval.evidence_sha256})
            blocks.append(
                {
                    "type": "actions",
                    "block_id": "decide",
                    "elements": [
                        {
                            "type": "button",
                            "action_id": "approve",
                            "style": "primary",
                            "text": {"type": "plain_text", "text": "Approve"},
                            "value": value,
                        },
                        {
                            "type": "button",
                            "action_id": "reject",
                            "style": "danger",
                            "text": {"type": "plain_text", "text": "Reject"},
                            "value": value,
                        },
                        _link_button("Open", link, "open"),
                    ],
                }
            )
    else:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _outcome(approval)}})
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    return fallback, blocks


def _link_button(text: str, url: str, action_id: str) -> dict[str, Any]:
    return {
        "type": "button",
        "action_id": action_id,
        "text": {"type": "plain_text", "text": text},
        "url": url,
    }


def _outcome(approval: ApprovalRequest) -> str:
    decisions = list(approval.decisions.select_related("reviewer"))
    names = ", ".join(d.reviewer.get_username() for d in decisions) or "nobody"
    if approval.status == A.APPROVED:
        return f":white_check_mark: *Approved* by {_escape(names)}."
    if approval.status == A.REJECTED:
        return f":x: *Rejected*: {_escape(approval.reason)}"
    if approval.status == A.EXPIRED:
        return ":hourglass: *Expired* before a decision; the run is cancelled."
    return f":no_entry_sign: *Voided*: {_escape(approval.reason)}"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_card_post(*, approval_id: int, channel: str) -> SlackCard:
    """Post ``approval``'s card to ``channel`` (a channel, or a user id for a direct message)
    and remember it for updates. Not idempotent: each call posts a message."""
    approval = ApprovalRequest.objects.select_related("run__workflow", "run__launched_by").get(
        pk=approval_id
    )
    text, blocks = _with_notices(approval, *card_blocks(approval))
    response = client().chat_postMessage(channel=channel, text=text, blocks=blocks)
    return SlackCard.objects.create(
        approval=approval,
        channel=str(response["channel"]),
        ts=str(response["ts"]),
        addressed_to=channel,
        shown=card_state(approval),
    )


def slack_cards_update(*, approval_id: int) -> int:
    """Bring every card of the request up to date (``chat.update``); how many changed.
    Idempotent: a card already showing the current state is left alone. A pending card says
    when it was reminded and to whom it was escalated (``card_notices``)."""
    approval = ApprovalRequest.objects.select_related("run__workflow", "run__launched_by").get(
        pk=approval_id
    )
    state = card_state(approval)
    changed = 0
    for card in SlackCard.objects.filter(approval=approval).exclude(shown=state):
        text, blocks = _with_notices(approval, *card_blocks(approval))
        client().chat_update(channel=card.channel, ts=card.ts, text=text, blocks=blocks)
        SlackCard.objects.filter(pk=card.pk).update(shown=state)
        changed += 1
    return changed


def minutes_left(approval: ApprovalRequest) -> int:
    """Whole minutes until the request expires, rounded up (0 once it has)."""
    seconds = (approval.expires_at - timezone.now()).total_seconds()
    return max(0, -int(-seconds // 60))


def card_notices(approval: ApprovalRequest) -> list[str]:
    """What happened to a pending request since its card was posted: its escalation, then its
    reminder (newest last, as a reader of the card meets them)."""
    if approval.status != A.PENDING:
        return []
    notices = []
    if approval.escalated_at and approval.escalation_group:
        notices.append(
            f":arrow_double_up: *Escalated to {_escape(approval.escalation_group)}*: undecided "
            f"for {approval.escalate_after_minutes} min, so its members may decide it too."
        )
    if approval.reminded_at:
        notices.append(
            f":alarm_clock: *Reminder: expires in {minutes_left(approval)} min* "
            f"(at {approval.expires_at:%H:%M} UTC)."
        )
    return notices


def _with_notices(
    approval: ApprovalRequest, text: str, blocks: list[dict[str, Any]]
) -> tuple[str, list[dict[str, Any]]]:
    """The card with its notices under the header, where they are read first, and the newest
    leading its text (what Slack's notification shows); the card's own blocks are left as
    ``card_blocks`` made them."""
    notices = card_notices(approval)
    if not notices:
        return text, blocks
    if approval.reminded_at:
        text = f"Reminder: expires in {minutes_left(approval)} min. {text}"
    else:
        text = f"Escalated to {approval.escalation_group}. {text}"
    section = {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(notices)}}
    return text, [blocks[0], section, *blocks[1:]]


def slack_card_nudge(*, approval_id: int, channel: str, text: str) -> None:
    """Tell ``channel`` (a channel, or a user id for a direct message) that a pending request
    was reminded or escalated: a reply in the thread of the card already posted there (the card
    itself is brought up to date by ``slack_cards_update``), or, where none was, the card.
    Not idempotent: each call posts a message; a request no longer pending is left alone."""
    approval = ApprovalRequest.objects.get(pk=approval_id)
    if approval.status != A.PENDING:
        return
    card = SlackCard.objects.filter(approval=approval, addressed_to=channel).order_by("-pk").first()
    if card is None:
        slack_card_post(approval_id=approval_id, channel=channel)
        return
    link = f"{settings.PANDAWEB_BASE_URL}/approvals/{approval.pk}/"
    client().chat_postMessage(
        channel=card.channel, thread_ts=card.ts, text=f"{text} <{link}|Decide in pandaweb>"
    )


# Questions ---------------------------------------------------------------------------------------


def question_link(question: Question) -> str:
    return f"{settings.PANDAWEB_BASE_URL}/runs/{question.run_id}/#question"


def question_blocks(
    question: Question, *, reminder: bool = False
) -> tuple[str, list[dict[str, Any]]]:
    """The fallback text and blocks of a run's question: what it asks, who may answer, until
    when, and a link to answer on the run page. Answering stays in pandaweb (a one-time code
    never passes through Slack), so the message has no input and no answer in it."""

    run = question.run
    link = question_link(question)
    expires = int(question.expires_at.timestamp())
    pending = question.status == Question.Status.PENDING
    lead = "Reminder, still waiting for an answer" if reminder and pending else "A run asks"
    title = f"{lead}: {run.workflow.name} (run #{run.pk})"
    if question.answered_by == ASK_LAUNCHER:
        who = f"{run.launched_by.get_username()}, who launched the run"
    else:
        who = f"members of {question.answered_by}"
    kind = question.get_kind_display()
    if question.kind == Question.Kind.CHOICE and question.options:
        kind = "One of: " + " · ".join(question.options)
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title[:150]}},
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*{_escape(question.text)}*"}},
        {
            "type": "section",
            "fields": [
                {"type": "mrkdwn", "text": f"*Who may answer*\n{_escape(who)}"},
                {"type": "mrkdwn", "text": f"*Answer*\n{_escape(kind)}"[:2000]},
                {
                    "type": "mrkdwn",
                    "text": f"*Expires*\n<!date^{expires}^{{date_short_pretty}} {{time}}|"
                    f"{question.expires_at:%Y-%m-%d %H:%M} UTC>",
                },
                {
                    "type": "mrkdwn",
                    "text": f"*Launched by*\n{_escape(run.launched_by.get_username())}",
                },
            ],
        },
        {
            "type": "context",
            "elements": [
                {
                    "type": "mrkdwn",
                    "text": (
                        f"Answer on the run page: <{link}|run #{run.pk}>"
                        + (
                            " · the code is typed there, never here"
                            if question.kind == "code"
                            else ""
                        )
                        if pending
                        else f"The run page: <{link}|run #{run.pk}>"
                    ),
                }
            ],
        },
    ]
    if pending:
        blocks.append(
            {
                "type": "actions",
                "block_id": "answer",
                "elements": [_link_button("Answer in pandaweb", link, "open")],
            }
        )
    else:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _closed(question)}})
    return f"{title}: {question.text}", blocks


def _closed(question: Question) -> str:
    """How a question ended, without its answer: a code is never shown, and the rest belongs
    to the run page."""
    if question.status == Question.Status.ANSWERED:
        who = question.answerer.get_username() if question.answerer else "someone"
        at = question.answered_at or timezone.now()
        return f":white_check_mark: *Answered* by {_escape(who)} at {at:%Y-%m-%d %H:%M} UTC."
    if question.status == Question.Status.EXPIRED:
        return ":hourglass: *Nobody answered* in time; the run failed."
    return f":no_entry_sign: *Withdrawn*: {_escape(question.reason)}"


def slack_question_post(*, question_id: int, channel: str, reminder: bool = False) -> None:
    """Post a run's pending question to ``channel`` (a channel, or a user id for a direct
    message) and remember it for updates. Not idempotent: each call posts a message; a question
    no longer pending is not posted."""
    question = Question.objects.select_related("run__workflow", "run__launched_by").get(
        pk=question_id
    )
    if question.status != Question.Status.PENDING:
        return
    text, blocks = question_blocks(question, reminder=reminder)
    response = client().chat_postMessage(channel=channel, text=text, blocks=blocks)
    SlackQuestionMessage.objects.create(
        question=question,
        channel=str(response["channel"]),
        ts=str(response["ts"]),
        shown=question.status,
    )
    # Closed while this was being posted: the update sent then found no message to change.
    if Question.objects.filter(pk=question_id).exclude(status=question.status).exists():
        slack_question_messages_update(question_id=question_id)


def slack_question_messages_update(*, question_id: int) -> int:
    """Bring every message about the question up to date (``chat.update``) once it is answered,
    expired or withdrawn; how many changed. Idempotent: a message already showing the current
    state is left alone."""
    question = Question.objects.select_related("run__workflow", "run__launched_by", "answerer").get(
        pk=question_id
    )
    changed = 0
    failed: SlackApiError | None = None
    text, blocks = question_blocks(question)
    for message in question.slack_messages.exclude(shown=question.status):
        try:
            client().chat_update(channel=message.channel, ts=message.ts, text=text, blocks=blocks)
        except SlackApiError as exc:
            # A message deleted in Slack must not keep the others from being updated; the task
            # retries the rest (those already updated are left alone).
            logger.warning("could not update Slack message %s/%s: %s", message.channel,
                           message.ts, exc)  # fmt: skip
            failed = failed or exc
            continue
        SlackQuestionMessage.objects.filter(pk=message.pk).update(shown=question.status)
        changed += 1
    if failed is not None:
        raise failed
    return changed


def slack_question_channel(question: Question) -> str:
    """The workflow's approval channel, where its questions are posted too ('' for none)."""
    version = question.run.version
    if not settings.SLACK_BOT_TOKEN or version is None:
        return ""
    return version.settings_model.approval.slack_channel or ""


# Callbacks ---------------------------------------------------------------------------------------
