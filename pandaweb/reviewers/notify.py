"""One way to tell a person something: ``notify(user, event)`` picks their channels (e-mail,
Slack direct message, browser push) from their preferences and honours their quiet hours.

Quiet hours skip the channels that interrupt (Slack direct message and browser push); e-mail is
sent as usual because it waits in the inbox. Nothing is held back for later: the request stays in
the queue and in the workflow's Slack channel, where the reviewer finds it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime, time
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.contrib.auth.models import User
from django.core.mail import send_mail
from django.utils import timezone

from approvals import slack
from pandaweb.reviewers.models import NotificationPreference, PushSubscription, SlackIdentity
from pandaweb.reviewers.push import push_endpoint_refusal, vapid
from pandaweb.reviewers.selectors import Channel, preferences_of, reach_of

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ApprovalEvent:
    """Something a person is asked to do: decide an approval, or answer a run's question
    (``approval_id`` is then the question's id)."""

    kind: Literal[
        "approval.requested",
        "approval.reminded",
        "approval.escalated",
        "question.asked",
        "question.reminded",
    ]
    approval_id: int
    title: str
    body: str
    url: str
    # For a reminder or an escalation: the line a Slack card the person already has gets in
    # its thread, instead of a second copy of the card.
    nudge: str = ""


def in_quiet_hours(preference: NotificationPreference, now: datetime | None = None) -> bool:
    start, end = preference.quiet_start, preference.quiet_end
    if start is None or end is None or start == end:
        return False
    try:
        zone = ZoneInfo(preference.time_zone or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        zone = ZoneInfo("UTC")
    local: time = (now or timezone.now()).astimezone(zone).time()
    if start < end:
        return start <= local < end
    return local >= start or local < end  # across midnight, e.g. 22:00-07:00


def notify(user: User, event: ApprovalEvent) -> list[Channel]:
    """Deliver ``event`` to ``user`` on each channel they chose that can deliver (an address, a
    linked Slack account, a subscribed browser); the channels reached.

    Call after commit (it talks to mail, Slack and push services). Never raises: one channel's
    outage must not keep the others, or the caller's work, from happening.
    """
    preference = preferences_of(user)
    on = {reach.channel for reach in reach_of(user, preference) if reach.on}
    quiet = in_quiet_hours(preference)
    delivered: list[Channel] = []
    if "email" in on:
        try:
            send_mail(event.title, event.body, None, [user.email])
            delivered.append("email")
        except Exception:
            logger.exception("could not e-mail %s about %s", user.pk, event.kind)
    if quiet:
        return delivered
    if "slack" in on and _slack_dm(user, event):
        delivered.append("slack")
    if "push" in on and _push(user, event):
        delivered.append("push")
    return delivered


def _slack_dm(user: User, event: ApprovalEvent) -> bool:
    identity = SlackIdentity.objects.filter(user=user).first()
    if identity is None:
        return False
    try:
        # A bot may post to a user id: Slack delivers it as a direct message from the app.
        if event.kind in ("question.asked", "question.reminded"):
            # Answered on the run page only: a code never passes through Slack.
            slack.slack_question_post(
                question_id=event.approval_id,
                channel=identity.slack_user_id,
                reminder=event.kind == "question.reminded",
            )
        elif event.nudge:
            slack.slack_card_nudge(
                approval_id=event.approval_id, channel=identity.slack_user_id, text=event.nudge
            )
        else:
            slack.slack_card_post(approval_id=event.approval_id, channel=identity.slack_user_id)
    except Exception:
        logger.exception("could not send a Slack message to user %s", user.pk)
        return False
    return True


def _push(user: User, event: ApprovalEvent) -> bool:
    from pywebpush import WebPushException, webpush

    payload = json.dumps(
        {"title": event.title, "body": event.body.split("\n")[0], "url": event.url}
    )
    reached = False
    for subscription in PushSubscription.objects.filter(user=user).order_by("pk"):
        if push_endpoint_refusal(subscription.endpoint):
            continue
        try:
            webpush(
                subscription_info={
                    "endpoint": subscription.endpoint,
                    "keys": {"p256dh": subscription.p256dh, "auth": subscription.auth},
                },
                data=payload,
                vapid_private_key=vapid(),
                vapid_claims={"sub": settings.VAPID_SUBJECT},
                timeout=5,
                ttl=3600,
            )
            reached = True
        except WebPushException as exc:
            status = getattr(exc.response, "status_code", None)
            if status in (404, 410):  # the browser unsubscribed: forget it
                subscription.delete()
            else:
                logger.warning("push to subscription %s failed: %s", subscription.pk, exc)
        except Exception:
            logger.exception("push to subscription %s failed", subscription.pk)
    return reached
