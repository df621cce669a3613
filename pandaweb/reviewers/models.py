"""What pandaweb knows about a reviewer beyond the login: the Slack identity they proved is
theirs, their passkeys, how and when they want to be told about requests, and the bookkeeping of
the Slack cards and passkey challenges bound to approval requests."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class SlackIdentity(models.Model):
    """A Slack user (team + user id) proven to belong to a pandaweb user by a one-time code they
    sent through Slack's signed slash command. Display names never identify anyone."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="slack_identity"
    )
    team_id = models.CharField(max_length=32)
    slack_user_id = models.CharField(max_length=32)
    linked_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["team_id", "slack_user_id"], name="slack_identity_one_user"
            )
        ]

    def __str__(self) -> str:
        return f"{self.team_id}/{self.slack_user_id}"


class SlackQuestionMessage(models.Model):
    """A message pandaweb posted about a run's question (the workflow's channel, or a person's
    direct message), so every copy says when the question is answered, expires or is withdrawn."""

    question = models.ForeignKey(
        "approvals.Question", on_delete=models.CASCADE, related_name="slack_messages"
    )
    channel = models.CharField(max_length=32)
    ts = models.CharField(max_length=32)
    posted_at = models.DateTimeField(auto_now_add=True)
    # The status the message shows, so an update that changes nothing is not sent again.
    shown = models.CharField(max_length=40, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["channel", "ts"], name="slack_question_message_unique")
        ]

    def __str__(self) -> str:
        return f"Slack question message {self.channel}/{self.ts}"


class SlackLinkCode(models.Model):
    """A short-lived single-use code shown on the profile page; only its hash is kept."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    code_sha256 = models.CharField(max_length=64, unique=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"Slack link code of user {self.user_id}"


class SlackCard(models.Model):
    """A message pandaweb posted about an approval request, so every copy can be updated with
    the outcome (the workflow's channel, and reviewers' direct messages)."""

    approval = models.ForeignKey(
        "approvals.ApprovalRequest", on_delete=models.CASCADE, related_name="slack_cards"
    )
    # Where it was sent: the workflow's channel, or a reviewer's Slack user id (Slack answers
    # with the direct message's own channel id, ``channel``). A reminder or an escalation
    # replies in this card's thread rather than posting a second card there.
    addressed_to = models.CharField(max_length=32, blank=True)
    channel = models.CharField(max_length=32)
    ts = models.CharField(max_length=32)
    posted_at = models.DateTimeField(auto_now_add=True)
    # What the card shows (``approvals.slack.card_state``), so an update that changes nothing
    # is not sent again.
    shown = models.CharField(max_length=200, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["channel", "ts"], name="slack_card_unique_message")
        ]

    def __str__(self) -> str:
        return f"Slack card {self.channel}/{self.ts}"


class SlackDelivery(models.Model):
    """Signatures of Slack callbacks already handled: an exact replay inside Slack's five-minute
    timestamp window is refused (older ones fail the timestamp check)."""

    signature = models.CharField(max_length=100, unique=True)
    received_at = models.DateTimeField(auto_now_add=True, db_index=True)

    def __str__(self) -> str:
        return self.signature[:16]


class Passkey(models.Model):
    """A WebAuthn credential a user registered on their profile page."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="passkeys"
    )
    name = models.CharField(max_length=80, blank=True)
    credential_id = models.CharField(max_length=400, unique=True)  # base64url
    public_key = models.BinaryField()
    sign_count = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return self.name or f"Passkey {self.pk}"


class StepUpChallenge(models.Model):
    """A single-use server nonce for one reviewer's passkey assertion on one request. The
    WebAuthn challenge is sha256(evidence hash || nonce), so an assertion made for other evidence,
    another request or an earlier attempt never verifies here."""

    approval = models.ForeignKey(
        "approvals.ApprovalRequest", on_delete=models.CASCADE, related_name="+"
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    nonce = models.CharField(max_length=64)  # hex
    challenge = models.CharField(max_length=64, unique=True)  # hex sha256
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"Step-up challenge for request {self.approval_id}"


class NotificationPreference(models.Model):
    """How a user wants to hear about requests they may decide. During quiet hours the
    interrupting channels (browser push, Slack direct message) are skipped; e-mail is sent as
    usual, since it waits in the inbox."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_preference"
    )
    email = models.BooleanField(default=True)
    slack = models.BooleanField(default=True)
    push = models.BooleanField(default=True)
    quiet_start = models.TimeField(null=True, blank=True)
    quiet_end = models.TimeField(null=True, blank=True)
    time_zone = models.CharField(max_length=64, default="UTC")

    def __str__(self) -> str:
        return f"Notification preferences of user {self.user_id}"


class PushSubscription(models.Model):
    """A browser's Web Push subscription (its push service endpoint and keys)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="push_subscriptions"
    )
    endpoint = models.URLField(max_length=1000, unique=True)
    p256dh = models.CharField(max_length=200)
    auth = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"Push subscription {self.pk}"
