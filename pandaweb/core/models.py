from __future__ import annotations

from django.conf import settings
from django.db import models

from pandaweb.core.roles import CAPABILITY_LABELS, Role


class Capability(models.Model):
    """Holder of the capability permissions; it has no table.

    Django attaches permissions to a model's content type. This unmanaged model gives the
    capabilities of ``pandaweb.core.roles`` one stable home, independent of the apps that use them.
    """

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [(cap.value, label) for cap, label in CAPABILITY_LABELS.items()]

    def __str__(self) -> str:
        return "capabilities"


class WorkerHeartbeat(models.Model):
    """The last time each worker (Celery process or in-process thread pool) answered a ping."""

    class Mode(models.TextChoices):
        THREAD = "thread", "In-process thread"
        CELERY = "celery", "Celery worker"

    worker = models.CharField(max_length=200, unique=True)
    mode = models.CharField(max_length=10, choices=Mode.choices)
    pid = models.PositiveIntegerField()
    database_vendor = models.CharField(max_length=40)
    seen_at = models.DateTimeField()
    ping_nonce = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-seen_at"]

    def __str__(self) -> str:
        return f"{self.worker} ({self.get_mode_display()})"


DEFAULT_TEAM_SLUG = "default"


class Team(models.Model):
    """A part of the company (payables, procurement) whose workflows, credentials, runs and
    reviewers are kept apart from the others' in one installation."""

    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


def default_team_id() -> int:
    """The team everything belongs to until teams are set up: data from before teams, and what
    is made without naming a team where only the default exists."""
    team, _ = Team.objects.get_or_create(slug=DEFAULT_TEAM_SLUG, defaults={"name": "Default team"})
    return team.pk


class Membership(models.Model):
    """A person's role in one team: an operator in payables may be a reviewer in procurement.

    A role held through the global role group (Admins; Compliance given every team) applies to
    every team; a membership applies to its team only.
    """

    class TeamRole(models.TextChoices):
        OPERATORS = Role.OPERATORS.value, "Operator"
        REVIEWERS = Role.REVIEWERS.value, "Reviewer"
        COMPLIANCE = Role.COMPLIANCE.value, "Compliance"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="team_memberships"
    )
    role = models.CharField(max_length=20, choices=TeamRole.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team__name", "user__username", "role"]
        constraints = [
            models.UniqueConstraint(fields=["team", "user", "role"], name="membership_unique"),
        ]
        indexes = [
            # teams_where(): a person's teams for the roles granting one capability.
            models.Index(fields=["user", "role"], name="membership_user_role"),
        ]

    def __str__(self) -> str:
        return f"{self.user} · {self.get_role_display()} in {self.team}"
