from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models
from django.db.models import Q
from django.utils.functional import cached_property

from pandaweb.core.models import Team, default_team_id
from workflows.schema import FactSource, Parameter, WorkflowSettings, decision_fact_sources


class Credential(models.Model):
    """A named secret. Only its ciphertext is stored; the value is write-only everywhere."""

    class Kind(models.TextChoices):
        USERNAME_PASSWORD = "username_password", "Username and password"
        TOTP = "totp", "TOTP seed (one-time codes)"
        API_TOKEN = "api_token", "API token"

    name = models.SlugField(max_length=63, unique=True)
    # Only this team's workflows may use it (checked at publish and at every run).
    team = models.ForeignKey(
        Team, on_delete=models.PROTECT, related_name="credentials", default=default_team_id
    )
    kind = models.CharField(max_length=20, choices=Kind.choices)
    description = models.CharField(max_length=500, blank=True)
    # A Fernet token (MultiFernet, keys from the environment); never the plaintext.
    ciphertext = models.TextField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    value_changed_at = models.DateTimeField()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Workflow(models.Model):
    """A portal workflow: its identity and the settings the next published version will carry."""

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=63, unique=True)
    team = models.ForeignKey(
        Team, on_delete=models.PROTECT, related_name="workflows", default=default_team_id
    )
    description = models.TextField(blank=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    reviewer_group = models.ForeignKey(Group, on_delete=models.PROTECT, related_name="+")
    allowed_hosts = models.JSONField(default=list)
    step_budget = models.PositiveIntegerField(default=50)
    run_ttl_minutes = models.PositiveIntegerField(default=15)
    max_concurrent_runs = models.PositiveSmallIntegerField(default=3)
    approval_quorum = models.PositiveSmallIntegerField(default=1)
    approval_expiry_minutes = models.PositiveIntegerField(default=60)
    author_may_approve = models.BooleanField(default=False)
    # Reminders and escalation of approval requests (0: off); see ApprovalPolicy.
    approval_remind_before_minutes = models.PositiveIntegerField(default=0)
    approval_escalate_after_minutes = models.PositiveIntegerField(default=0)
    approval_escalation_group = models.CharField(max_length=150, blank=True)
    # The approval policy's chat and passkey options and decision facts
    # (``schema.APPROVAL_REACH_OPTIONS``), only those that differ from the defaults.
    approval_reach = models.JSONField(default=dict, blank=True)
    # The filmstrip options (``schema.RECORDING_OPTIONS``), only those that differ from the
    # defaults (docs/live-view.md).
    recording = models.JSONField(default=dict, blank=True)
    credentials = models.ManyToManyField(Credential, blank=True, related_name="workflows")
    archived = models.BooleanField(default=False)
    # Offered to AI agents as an MCP tool (docs/mcp.md). An administrator's choice, off by default:
    # publishing a workflow does not by itself hand it to a model.
    offer_as_tool = models.BooleanField(default=False)
    # What trying steps on the live page taught (a click that only opens a dialog, by step id),
    # each with the target it was seen for: the editor stops warning about it.
    page_facts = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(step_budget__gte=1), name="workflow_budget_positive"
            ),
            models.CheckConstraint(
                condition=Q(run_ttl_minutes__gte=1), name="workflow_ttl_positive"
            ),
            models.CheckConstraint(
                condition=Q(approval_quorum__gte=1), name="workflow_quorum_positive"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class WorkflowVersion(models.Model):
    """Steps and parameters of a workflow. A draft is edited; a published version never changes.

    Published rows are protected by database triggers (UPDATE and DELETE refused), so not even a
    bug or a hand-typed SQL statement can change what a run pinned.
    """

    class Status(models.TextChoices):
        DRAFT = "draft", "Draft"
        PUBLISHED = "published", "Published"

    workflow = models.ForeignKey(Workflow, on_delete=models.PROTECT, related_name="versions")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.DRAFT)
    number = models.PositiveIntegerField(null=True, blank=True)
    parameters = models.JSONField(default=list)
    steps = models.JSONField(default=list)
    # The session template block (login steps and the logged-in check), or None.
    session = models.JSONField(null=True, blank=True)
    # The complete file (identity, settings, parameters, steps) as published; empty for drafts.
    document = models.JSONField(null=True, blank=True)
    content_hash = models.CharField(max_length=64, blank=True)
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )
    message = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    published_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["workflow", "-number"]
        constraints = [
            models.UniqueConstraint(
                fields=["workflow", "number"], name="version_number_unique_per_workflow"
            ),
            models.UniqueConstraint(
                fields=["workflow"],
                condition=Q(status="draft"),
                name="one_draft_per_workflow",
            ),
            models.CheckConstraint(
                condition=(
                    Q(status="draft", number__isnull=True, document__isnull=True)
                    | Q(
                        status="published",
                        number__isnull=False,
                        document__isnull=False,
                        author__isnull=False,
                        published_at__isnull=False,
                    )
                    & ~Q(content_hash="")
                ),
                name="version_published_is_complete",
            ),
        ]

    def __str__(self) -> str:
        label = f"v{self.number}" if self.number else "draft"
        return f"{self.workflow} {label}"

    @cached_property
    def settings_model(self) -> WorkflowSettings:
        """The version's settings, typed: what services read (the defaults live in the schema
        and nowhere else). A published document was validated, so this does not fail for one."""
        return WorkflowSettings.model_validate((self.document or {}).get("settings") or {})

    @cached_property
    def decision_fact_sources(self) -> list[FactSource]:
        """Where this version's runs find the facts a reviewer decides on."""
        parameters = [
            Parameter.model_validate(p) for p in (self.document or {}).get("parameters", [])
        ]
        return decision_fact_sources(self.settings_model.approval.facts, parameters)

    @property
    def is_draft(self) -> bool:
        return self.status == self.Status.DRAFT
