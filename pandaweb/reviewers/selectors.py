"""Reads about reaching a person: which of their channels can deliver, and where to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from django.conf import settings
from django.contrib.auth.models import User

from pandaweb.reviewers.models import NotificationPreference, PushSubscription, SlackIdentity

Channel = Literal["email", "slack", "push"]


def preferences_of(user: User) -> NotificationPreference:
    """The user's preferences (the defaults when they never saved any; nothing is written)."""
    try:
        return user.notification_preference
    except NotificationPreference.DoesNotExist:
        return NotificationPreference(user=user)


@dataclass(frozen=True)
class Reach:
    """One channel to a person: whether they chose it, where it delivers, and, when it cannot
    deliver, what is missing (in words for the profile page)."""

    channel: Channel
    label: str
    chosen: bool
    where: str
    missing: str

    @property
    def on(self) -> bool:
        """A channel is off until it can deliver, whatever the preference says."""
        return self.chosen and not self.missing


def reach_of(user: User, preference: NotificationPreference | None = None) -> list[Reach]:
    """The person's channels in the order ``notify`` uses them."""

    preference = preference or preferences_of(user)
    identity = SlackIdentity.objects.filter(user=user).first()
    devices = PushSubscription.objects.filter(user=user).count()
    if not settings.SLACK_BOT_TOKEN:
        slack_missing = "Slack is not configured on this installation"
    elif identity is None:
        slack_missing = "link your Slack account first"
    else:
        slack_missing = ""
    return [
        Reach(
            channel="email",
            label="E-mail",
            chosen=preference.email,
            where=f"by e-mail to {user.email}",
            missing="" if user.email else "add an e-mail address first",
        ),
        Reach(
            channel="slack",
            label="Slack direct message",
            chosen=preference.slack,
            where="as a Slack direct message",
            missing=slack_missing,
        ),
        Reach(
            channel="push",
            label="Browser notifications",
            chosen=preference.push,
            where="by push to the browser you enabled"
            if devices == 1
            else f"by push to the {devices} browsers you enabled",
            missing="" if devices else "enable them in a browser first",
        ),
    ]


# What the person can do about a channel that cannot deliver (none for Slack without an app).
REMEDIES: dict[str, str] = {
    "add an e-mail address first": "add an e-mail address",
    "link your Slack account first": "link Slack",
    "enable them in a browser first": "enable browser notifications",
}


def reach_sentence(reaches: list[Reach]) -> str:
    """What reaches the person and where, in one sentence (the profile page's summary); when
    nothing does, what they can do about it."""

    ways = [r.where for r in reaches if r.on]
    if ways:
        listed = ways[0] if len(ways) == 1 else ", ".join(ways[:-1]) + " and " + ways[-1]
        return f"Approval requests and questions for you arrive {listed}."
    remedies = [REMEDIES[r.missing] for r in reaches if r.missing in REMEDIES]
    if any(not r.missing and not r.chosen for r in reaches):
        remedies.append("tick a channel you turned off")
    listed = remedies[0] if len(remedies) == 1 else ", ".join(remedies[:-1]) + " or " + remedies[-1]
    return f"Nothing reaches you outside this dashboard: {listed} below."
