"""How long a request has left, in the words the live countdown (static/pandaweb/countdown.js)
uses, so the page reads the same before and after its script starts."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone

register = template.Library()

# Below this many seconds the countdown is shown as urgent.
SOON_SECONDS = 300


def countdown_text(seconds: float) -> str:
    """Mirrors ``text()`` in static/pandaweb/countdown.js."""
    left = int(seconds)
    if left <= 0:
        return "expired"
    if left < 60:
        return f"expires in {left} s"
    minutes = left // 60
    if minutes < 60:
        return f"expires in {minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"expires in {hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"expires in {days} d {hours} h"


@register.inclusion_tag("approvals/partials/_expiry.html")
def expiry(expires_at: datetime) -> dict[str, Any]:
    """A countdown to ``expires_at`` that counts on by itself in the browser."""
    seconds = max(0, int((expires_at - timezone.now()).total_seconds()))
    return {
        "expires_at": expires_at,
        "seconds": seconds,
        "text": countdown_text(seconds),
        "soon": seconds < SOON_SECONDS,
    }
