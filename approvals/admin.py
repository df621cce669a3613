from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from approvals.models import ApprovalRequest


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(admin.ModelAdmin[ApprovalRequest]):
    list_display = ["id", "status", "created_at", "expires_at"]
    list_filter = ["status"]

    def has_change_permission(
        self, request: HttpRequest, obj: ApprovalRequest | None = None
    ) -> bool:
        # Decisions go through the approval services, which enforce the policy and audit them.
        return False
