"""The facts a reviewer decides on, as text, wherever a request is shown (the queue, the home
page, the decision page's first screen)."""

from __future__ import annotations

from typing import Any

from django import template

from approvals.facts import approval_facts
from approvals.models import ApprovalRequest

register = template.Library()


@register.inclusion_tag("approvals/partials/_facts.html")
def decision_facts(approval: ApprovalRequest, size: str = "") -> dict[str, Any]:
    return {"facts": approval_facts(approval), "size": size}
