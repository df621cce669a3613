from __future__ import annotations

from django.db import models


class ApprovalRequest(models.Model):
    """A human gate in front of one irreversible step.

    The evidence, the run it belongs to and the decisions arrive with the approvals feature; the
    foundation needs the status so that the navigation can count what is pending.
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

    class Meta:
        ordering = ["created_at"]
        indexes = [
            # The pending-count badge and the queue (pending, oldest first).
            models.Index(fields=["status", "created_at"], name="approval_status_created"),
        ]

    def __str__(self) -> str:
        return f"Approval request #{self.pk} ({self.get_status_display()})"
