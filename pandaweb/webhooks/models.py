from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from pandaweb.core.models import Team, default_team_id
from sessions.models import Run
from workflows.models import Workflow


class Event(models.TextChoices):
    RUN_FINISHED = "run.finished", "A run succeeded"
    RUN_FAILED = "run.failed", "A run failed, expired, was interrupted or cancelled"
    RUN_NEEDS_RECONCILIATION = "run.needs_reconciliation", "A run needs reconciliation"
    APPROVAL_REQUESTED = "approval.requested", "An approval was requested"
    APPROVAL_DECIDED = "approval.decided", "An approval was decided (approved, rejected, expired)"


class Subscription(models.Model):
    """Where to POST which events: for one workflow, or for all of them (``workflow`` empty).

    The signing secret is sealed with the credential vault: it has to be read back to sign, so it
    cannot be hashed; it is shown to a person once, when the subscription is made.
    """

    name = models.CharField(max_length=200)
    url = models.URLField(max_length=2000)
    # Only this team's events are sent to it.
    team = models.ForeignKey(
        Team, on_delete=models.PROTECT, related_name="+", default=default_team_id
    )
    workflow = models.ForeignKey(
        Workflow, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    events = models.JSONField(default=list)
    # A launch's ``callback_url``: this run's events only, made with the run and not listed
    # among the installation's subscriptions.
    run = models.OneToOneField(
        Run, on_delete=models.CASCADE, null=True, blank=True, related_name="callback"
    )
    secret_sealed = models.TextField()
    active = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=500, blank=True)
    # Failed attempts since the last success; at WEBHOOK_DISABLE_AFTER the subscription stops.
    consecutive_failures = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "pk"]

    def __str__(self) -> str:
        return self.name


class Message(models.Model):
    """One event for one subscription: the outbox row, written in the transaction of the change.

    ``msg_id`` is the Standard Webhooks ``webhook-id``: the same on every attempt, so a receiver
    can drop a message it already handled.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Given up"

    subscription = models.ForeignKey(
        Subscription, on_delete=models.CASCADE, related_name="messages"
    )
    msg_id = models.CharField(max_length=40, unique=True)
    event = models.CharField(max_length=40, choices=Event.choices)
    payload = models.JSONField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    # A worker's claim: until then no other worker may deliver this message.
    locked_until = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        indexes = [
            # The drain: pending messages that are due, oldest first.
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(status="pending"),
                name="webhook_message_due",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event} → {self.subscription} ({self.get_status_display()})"


class Attempt(models.Model):
    """One POST of a message and what the receiver answered (or why there was no answer)."""

    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="delivery_attempts")
    started_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField()
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)
    ok = models.BooleanField(default=False)
    # Started by a person's "redeliver" rather than the schedule.
    manual = models.BooleanField(default=False)

    class Meta:
        ordering = ["-started_at", "-pk"]

    def __str__(self) -> str:
        return f"attempt of {self.message_id}: {self.status_code or self.error}"
