from __future__ import annotations

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
