"""Writes about a reviewer: linking a Slack identity, notification preferences, push
subscriptions (passkeys are in ``passkeys``)."""

from __future__ import annotations

import hashlib
import secrets
from datetime import time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.utils import timezone

from pandaweb.audit.services import audit_record
from pandaweb.reviewers.models import (
    NotificationPreference,
    PushSubscription,
    SlackIdentity,
    SlackLinkCode,
)
from pandaweb.reviewers.push import push_endpoint_refusal

LINK_CODE_LIFETIME = timedelta(minutes=10)
# No 0/O, 1/I/L: the code is read off one screen and typed into another.
LINK_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"


class ReviewerError(Exception):
    """Refused; the message is for people."""


def _code_hash(code: str) -> str:
    return hashlib.sha256(code.strip().upper().encode()).hexdigest()


def slack_link_code_issue(*, user: User) -> str:
    """A new single-use code (10 minutes) the user sends with ``/pandaweb link CODE``; their
    earlier unused codes stop working."""
    code = "".join(secrets.choice(LINK_ALPHABET) for _ in range(10))
    with transaction.atomic():
        SlackLinkCode.objects.filter(user=user, used_at__isnull=True).delete()
        SlackLinkCode.objects.create(
            user=user,
            code_sha256=_code_hash(code),
            expires_at=timezone.now() + LINK_CODE_LIFETIME,
        )
    return code


def slack_identity_link(*, team_id: str, slack_user_id: str, code: str) -> User:
    """Link the Slack user who sent ``code`` (Slack signed who they are) to the code's owner.

    Refused for an unknown, used or expired code, and for a Slack account already linked to
    another pandaweb user. Not idempotent: the code is spent.
    """
    if not team_id or not slack_user_id:
        raise ReviewerError("Slack did not say who you are")
    with transaction.atomic():
        issued = (
            SlackLinkCode.objects.select_for_update()
            .select_related("user")
            .filter(code_sha256=_code_hash(code))
            .first()
        )
        if issued is None or issued.used_at is not None or issued.expires_at <= timezone.now():
            raise ReviewerError("that code is unknown, used or expired: get a new one")
        taken = SlackIdentity.objects.filter(team_id=team_id, slack_user_id=slack_user_id).exclude(
            user=issued.user
        )
        if taken.exists():
            raise ReviewerError("this Slack account is linked to another pandaweb user")
        issued.used_at = timezone.now()
        issued.save(update_fields=["used_at"])
        SlackIdentity.objects.update_or_create(
            user=issued.user, defaults={"team_id": team_id, "slack_user_id": slack_user_id}
        )
        audit_record(
            action="slack.linked",
            object_type="user",
            object_id=issued.user.pk,
            actor=issued.user,
            after={"team_id": team_id, "slack_user_id": slack_user_id},
        )
    return issued.user


def slack_identity_unlink(*, user: User) -> None:
    with transaction.atomic():
        deleted, _ = SlackIdentity.objects.filter(user=user).delete()
        if deleted:
            audit_record(action="slack.unlinked", object_type="user", object_id=user.pk, actor=user)


def email_address_set(*, user: User, address: str) -> str:
    """Set (or, empty, clear) the address approval requests and questions are e-mailed to; the
    address as saved. Refused for what is not an e-mail address. Idempotent: saving the same
    address again changes and records nothing."""
    address = User.objects.normalize_email(address.strip())
    if address:
        try:
            validate_email(address)
        except ValidationError:
            raise ReviewerError(
                f"{address!r} is not an e-mail address; write it like name@example.com"
            ) from None
        # Django's own limit, as in the user table (RFC 5321: 254 characters).
        if len(address) > User._meta.get_field("email").max_length:  # type: ignore[operator]
            raise ReviewerError("that address is longer than 254 characters")
    with transaction.atomic():
        locked = User.objects.select_for_update().get(pk=user.pk)
        before = locked.email
        if before == address:
            return address
        locked.email = address
        locked.save(update_fields=["email"])
        user.email = address
        audit_record(
            action="notifications.email_changed",
            object_type="user",
            object_id=user.pk,
            actor=user,
            before={"email": before},
            after={"email": address},
        )
    return address


def notification_preference_update(
    *,
    user: User,
    email: bool,
    slack: bool,
    push: bool,
    quiet_start: time | None,
    quiet_end: time | None,
    time_zone: str,
) -> NotificationPreference:
    try:
        ZoneInfo(time_zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ReviewerError(f"unknown time zone {time_zone!r}") from None
    if (quiet_start is None) != (quiet_end is None):
        raise ReviewerError("quiet hours need both a start and an end")
    with transaction.atomic():
        preference, _ = NotificationPreference.objects.select_for_update().update_or_create(
            user=user,
            defaults={
                "email": email,
                "slack": slack,
                "push": push,
                "quiet_start": quiet_start,
                "quiet_end": quiet_end,
                "time_zone": time_zone,
            },
        )
        audit_record(
            action="notifications.preferences_changed",
            object_type="user",
            object_id=user.pk,
            actor=user,
            after={
                "email": email,
                "slack": slack,
                "push": push,
                "quiet": f"{quiet_start}-{quiet_end}" if quiet_start else "",
                "time_zone": time_zone,
            },
        )
    return preference


def push_subscription_save(
    *, user: User, endpoint: str, p256dh: str, auth: str
) -> PushSubscription:
    refusal = push_endpoint_refusal(endpoint)
    if refusal:
        raise ReviewerError(refusal)
    if not p256dh or not auth:
        raise ReviewerError("the subscription has no keys")
    subscription, _ = PushSubscription.objects.update_or_create(
        endpoint=endpoint, defaults={"user": user, "p256dh": p256dh, "auth": auth}
    )
    return subscription
