from __future__ import annotations

from django.contrib import admin

from pandaweb.api.models import ApiToken, ServiceAccount


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin[ApiToken]):
    """Read-only: tokens are made and revoked on the dashboard's token pages (audited there)."""

    list_display = ["name", "prefix", "user", "kind", "created_at", "expires_at", "revoked_at"]
    readonly_fields = [f.name for f in ApiToken._meta.fields]

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False


admin.site.register(ServiceAccount)
