from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest
from django.urls import reverse

from approvals.selectors import needs_badge
from pandaweb.core.models import Membership
from pandaweb.core.permissions import is_admin, user_can
from pandaweb.core.roles import Capability


@dataclass(frozen=True)
class NavItem:
    key: str
    label: str
    url: str


_SECTIONS: tuple[tuple[str, str, str, Capability], ...] = (
    ("workflows", "Workflows", "workflows:index", Capability.VIEW_WORKFLOWS),
    ("runs", "Runs", "runs:index", Capability.VIEW_RUNS),
    ("approvals", "Approvals", "approvals:index", Capability.VIEW_APPROVALS),
    ("audit", "Audit", "audit:index", Capability.VIEW_AUDIT),
    ("webhooks", "Webhooks", "webhooks:index", Capability.VIEW_SYSTEM),
    ("system", "System", "system", Capability.VIEW_SYSTEM),
)


def navigation(request: HttpRequest) -> dict[str, Any]:
    user = request.user
    if not user.is_authenticated:
        return {}
    items = [
        NavItem(key=key, label=label, url=reverse(url_name))
        for key, label, url_name, capability in _SECTIONS
        if user_can(user, capability)
    ]
    if is_admin(user):
        items.append(NavItem(key="teams", label="Teams", url=reverse("teams:index")))
    match = request.resolver_match
    badge = needs_badge(user)
    return {
        "nav_items": items,
        "nav_active": match.namespace or match.url_name if match else "",
        "nav_roles": sorted(group.name for group in user.groups.all())
        + [
            f"{membership.get_role_display()} in {membership.team.name}"
            for membership in Membership.objects.filter(user_id=user.pk).select_related("team")
        ],
        "badge": badge,
    }
