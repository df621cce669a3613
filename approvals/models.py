from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django.db import models

from sessions.models import Run


class ApprovalRequest(models.Model):
    """A human gate in front of one irreversible step of one run, with what the robot saw.

    ``evidence`` and the two pictures are frozen when the request is made; ``evidence_sha256``
    covers all of it (the pictures by their own hashes). A request that is superseded because the
    page changed since approval points to its successor through ``superseded_by``.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"
        EXPIRED = "expired", "Expired"
        VOIDED = "voided", "Voided"

    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="approvals")
    step_index = models.PositiveIntegerField(default=0)
    step_id = models.CharField(max_length=63, blank=True)
    action = models.TextField(blank=True)
    evidence = models.JSONField(default=dict)
    evidence_sha256 = models.CharField(max_length=64, blank=True)
    screenshot = models.CharField(max_length=300, blank=True)
    outlined = models.CharField(max_length=300, blank=True)
    quorum = models.PositiveSmallIntegerField(default=1)
    author_may_approve = models.BooleanField(default=False)
    reviewer_group = models.CharField(max_length=150, default="Reviewers")
    # Hand-over and escalation, frozen from the workflow's policy when the request is made.
    # ``assignee`` is the person it was handed to (notified; they decide only if the policy lets
    # them); an escalated request may also be decided by ``escalation_group``.
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
    )
    remind_before_minutes = models.PositiveIntegerField(default=0)
    escalate_after_minutes = models.PositiveIntegerField(default=0)
    escalation_group = models.CharField(max_length=150, blank=True)
    # Housekeeping sends each of these once: set by a conditional update before the message goes.
    reminded_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    previous = models.OneToOneField(
        "self", on_delete=models.PROTECT, null=True, blank=True, related_name="superseded_by"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)
    # Exactly-once bookkeeping of the gated action: set under the run's lock by the runner's
    # writer, before the click and after it.
    continued_at = models.DateTimeField(null=True, blank=True)
    intent_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    # The portal said no to the action (in ``action_result``'s words): it was not done, and
    # there is nothing to reconcile.
    refused_at = models.DateTimeField(null=True, blank=True)
    # How the portal answered the action: its expected outcome and any dialog it opened, or
    # its refusal.
    action_result = models.TextField(blank=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [
            # The pending-count badge and the queue (pending, oldest first).
            models.Index(fields=["status", "created_at"], name="approval_status_created"),
            models.Index(fields=["status", "expires_at"], name="approval_status_expires"),
        ]

    def __str__(self) -> str:
        return f"Approval request #{self.pk} ({self.get_status_display()})"

    @property
    def action_summary(self) -> str:
        """The action with the page named by its host: lists have no room for a whole address,
        which the decision page shows."""
        url = str((self.evidence or {}).get("url") or "")
        suffix = f" on {url}"
        if url and self.action.endswith(suffix):
            return f"{self.action.removesuffix(suffix)} on {urlsplit(url).netloc or url}"
        return self.action

    @property
    def approvals_count(self) -> int:
        return sum(1 for d in self.decisions.all() if d.verdict == ApprovalDecision.Verdict.APPROVE)


class ApprovalDecision(models.Model):
    """One reviewer's verdict. One per person and request: a second click changes nothing."""

    class Verdict(models.TextChoices):
        APPROVE = "approve", "Approve"
        REJECT = "reject", "Reject"

    request = models.ForeignKey(ApprovalRequest, on_delete=models.PROTECT, related_name="decisions")
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    verdict = models.CharField(max_length=7, choices=Verdict.choices)
    reason = models.TextField(blank=True)
    evidence_sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["request", "reviewer"], name="approval_decision_one_per_reviewer"
            )
        ]

    def __str__(self) -> str:
        return f"{self.get_verdict_display()} of request #{self.request_id}"


class ApprovalComment(models.Model):
    """A remark on a request, for the other reviewers: never a verdict."""

    request = models.ForeignKey(ApprovalRequest, on_delete=models.PROTECT, related_name="comments")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    body = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "pk"]

    def __str__(self) -> str:
        return f"Comment on request #{self.request_id}"


class ReviewerAbsence(models.Model):
    """A reviewer's out-of-office: no approval notifications from ``away_from`` to ``away_until``
    (both days included). It never takes away the right to decide."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="reviewer_absence"
    )
    away_from = models.DateField()
    away_until = models.DateField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(away_until__gte=models.F("away_from")),
                name="reviewer_absence_ordered",
            )
        ]

    def __str__(self) -> str:
        return f"{self.user} away {self.away_from}..{self.away_until}"


class Question(models.Model):
    """What an ``ask`` step of a run asks a person, and the answer that lets the run go on.

    A one-time code is never stored in clear: ``answer_sealed`` holds it encrypted with the
    credential keys from the answer until the continuation takes it (then it is wiped in the same
    transaction); ``answer`` holds only text and choice answers.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Waiting for an answer"
        ANSWERED = "answered", "Answered"
        EXPIRED = "expired", "Nobody answered"
        VOIDED = "voided", "Withdrawn"

    class Kind(models.TextChoices):
        TEXT = "text", "Text"
        CODE = "code", "One-time code"
        CHOICE = "choice", "Choice"

    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="questions")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    step_index = models.PositiveIntegerField()
    step_id = models.CharField(max_length=63)
    text = models.TextField()
    kind = models.CharField(max_length=10, choices=Kind.choices)
    options = models.JSONField(default=list, blank=True)
    save_as = models.CharField(max_length=63)
    # "launcher" or a group's name, frozen from the step when it asked.
    answered_by = models.CharField(max_length=150)
    timeout_minutes = models.PositiveIntegerField()
    answerer = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
    )
    answered_at = models.DateTimeField(null=True, blank=True)
    answer = models.TextField(blank=True)
    answer_sealed = models.TextField(blank=True)
    # Set under the run's lock by the first continuation: a second one does nothing.
    continued_at = models.DateTimeField(null=True, blank=True)
    # Claimed by a conditional update (only where still empty): one reminder, however many
    # housekeeping passes run at once.
    reminded_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [
            # The queue's "questions for me", housekeeping's expiry and reminders (pending, by
            # deadline).
            models.Index(fields=["status", "expires_at"], name="question_status_expires"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=~models.Q(kind="code") | models.Q(answer=""),
                name="question_code_never_in_clear",
            ),
        ]

    def __str__(self) -> str:
        return f"Question #{self.pk} of run #{self.run_id} ({self.get_status_display()})"
