from __future__ import annotations

from django.db.models import QuerySet

from approvals.models import ApprovalRequest


def approval_pending_count() -> int:
    return ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING).count()


def approval_pending_list() -> QuerySet[ApprovalRequest]:
    return ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING).order_by(
        "created_at"
    )
