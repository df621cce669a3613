"""Chat cards, posted and updated after commit (ids in, one service call)."""

from __future__ import annotations

import logging
from typing import Any
from urllib.error import URLError

from celery import shared_task
from slack_sdk.errors import SlackApiError

from approvals.models import ApprovalRequest, Question

logger = logging.getLogger(__name__)

# Slack may be briefly unreachable or rate-limit us: a few retries, further apart each time.
CHAT_CALL: dict[str, Any] = {
    "ignore_result": True,
    "autoretry_for": (SlackApiError, URLError, TimeoutError),
    "retry_backoff": True,
    "max_retries": 3,
}


@shared_task(name="approvals.slack_card_post", **CHAT_CALL)
def slack_card_post_task(*, approval_id: int, channel: str) -> None:
    from approvals import slack

    try:
        slack.slack_card_post(approval_id=approval_id, channel=channel)
    except ApprovalRequest.DoesNotExist:
        logger.info("approval %s is gone; no card", approval_id)


@shared_task(name="approvals.slack_cards_update", **CHAT_CALL)
def slack_cards_update_task(*, approval_id: int) -> None:
    from approvals import slack

    try:
        slack.slack_cards_update(approval_id=approval_id)
    except ApprovalRequest.DoesNotExist:
        logger.info("approval %s is gone; no card to update", approval_id)


@shared_task(name="approvals.slack_card_nudge", **CHAT_CALL)
def slack_card_nudge_task(*, approval_id: int, channel: str, text: str) -> None:
    from approvals import slack

    try:
        slack.slack_card_nudge(approval_id=approval_id, channel=channel, text=text)
    except ApprovalRequest.DoesNotExist:
        logger.info("approval %s is gone; nothing to remind", approval_id)


@shared_task(name="approvals.slack_question_post", **CHAT_CALL)
def slack_question_post_task(*, question_id: int, channel: str, reminder: bool = False) -> None:
    from approvals import slack

    try:
        slack.slack_question_post(question_id=question_id, channel=channel, reminder=reminder)
    except Question.DoesNotExist:
        logger.info("question %s is gone; nothing to post", question_id)


@shared_task(name="approvals.slack_question_messages_update", **CHAT_CALL)
def slack_question_messages_update_task(*, question_id: int) -> None:
    from approvals import slack

    try:
        slack.slack_question_messages_update(question_id=question_id)
    except Question.DoesNotExist:
        logger.info("question %s is gone; no message to update", question_id)
