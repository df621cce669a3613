from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from workflows.models import Workflow, WorkflowVersion


class SessionTemplate(models.Model):
    """A logged-in browser, baked once from a version's ``session`` block, that runs fork.

    The snapshot is either a Playwright storage state (cookies and local storage, encrypted with
    the credential vault, portable between hosts) or a whole saved VM (``state_path`` on
    ``host``). Only the newest ready template of (version, backend, host) is forked; a new bake
    retires the ones before it.
    """

    class Status(models.TextChoices):
        BAKING = "baking", "Baking"
        READY = "ready", "Ready"
        # A run woke up logged out: a person re-bakes (never retried on its own).
        STALE = "stale", "Stale"
        FAILED = "failed", "Bake failed"
        RETIRED = "retired", "Retired"

    version = models.ForeignKey(
        WorkflowVersion, on_delete=models.PROTECT, related_name="session_templates"
    )
    backend = models.CharField(max_length=20)
    # The machine holding ``state_path``; blank while baking and for portable snapshots.
    host = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.BAKING)
    # Fernet token of the storage state: its cookies are as good as the password.
    state = models.TextField(blank=True)
    state_path = models.CharField(max_length=500, blank=True)
    # None: baked on schedule.
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Set by the worker that claims the bake; a second delivery of the task finds it set.
    bake_started_at = models.DateTimeField(null=True, blank=True)
    baked_at = models.DateTimeField(null=True, blank=True)
    failure_reason = models.TextField(blank=True)
    stale_reason = models.TextField(blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["version", "backend", "host"],
                condition=Q(status="baking"),
                name="session_template_one_bake_at_a_time",
            ),
        ]
        indexes = [
            # The run's pick (newest ready of a version and backend) and the workflow page's.
            models.Index(fields=["version", "backend", "status"], name="session_template_pick"),
            # The schedule: ready templates by age.
            models.Index(fields=["status", "baked_at"], name="session_template_due"),
        ]

    def __str__(self) -> str:
        return f"Session template #{self.pk} of {self.version}"

    @property
    def is_vm_snapshot(self) -> bool:
        return bool(self.state_path)


class Run(models.Model):
    """One execution of a published workflow version in its own disposable browser."""

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        STARTING = "starting", "Starting"
        RUNNING = "running", "Running"
        AWAITING_APPROVAL = "awaiting_approval", "Awaiting approval"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"
        EXPIRED = "expired", "Expired"
        INTERRUPTED = "interrupted", "Interrupted"
        # An irreversible action was started and its end was never recorded: a person checks
        # the portal and says whether it happened. Never retried automatically.
        NEEDS_RECONCILIATION = "needs_reconciliation", "Needs reconciliation"

    FINAL = frozenset({"succeeded", "failed", "cancelled", "expired", "interrupted"})
    ACTIVE = frozenset({"starting", "running", "awaiting_approval"})

    workflow = models.ForeignKey(Workflow, on_delete=models.PROTECT, related_name="runs")
    version = models.ForeignKey(WorkflowVersion, on_delete=models.PROTECT, related_name="runs")
    status = models.CharField(max_length=24, choices=Status.choices, default=Status.QUEUED)
    inputs = models.JSONField(default=dict)
    outputs = models.JSONField(default=dict)
    idempotency_key = models.CharField(max_length=100, blank=True)
    launched_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    sandbox_backend = models.CharField(max_length=20, default="local")
    # Sandbox.to_dict() while the sandbox exists: any process on its host can destroy it.
    sandbox = models.JSONField(null=True, blank=True)
    sandbox_ready_seconds = models.FloatField(null=True, blank=True)
    # What isolated this run's browser and how it started (backend, accelerator, warnings):
    # kept after the sandbox record is cleared, for the run page and the audit.
    sandbox_facts = models.JSONField(default=dict, blank=True)
    session_template = models.ForeignKey(
        SessionTemplate, on_delete=models.PROTECT, related_name="runs", null=True, blank=True
    )
    worker = models.CharField(max_length=200, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    deadline_at = models.DateTimeField(null=True, blank=True)
    steps_executed = models.PositiveIntegerField(default=0)
    failure_reason = models.TextField(blank=True)
    failure_step = models.CharField(max_length=63, blank=True)
    cancel_requested = models.BooleanField(default=False)
    # The last RunEvent sequence number handed out; bumped under the run's row lock.
    last_event_seq = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["launched_by", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="run_idempotency_key_unique_per_user",
            ),
        ]
        indexes = [
            # The reaper: active runs whose heartbeat went quiet.
            models.Index(fields=["status", "heartbeat_at"], name="run_status_heartbeat"),
        ]

    def __str__(self) -> str:
        return f"Run #{self.pk} of {self.workflow}"

    @property
    def is_final(self) -> bool:
        return self.status in self.FINAL

    @property
    def duration_seconds(self) -> float | None:
        if self.started_at is None:
            return None
        end = self.finished_at
        if end is None:
            return None
        return (end - self.started_at).total_seconds()


class StepResult(models.Model):
    """What one executed step did and what the robot saw around it."""

    class Status(models.TextChoices):
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        BLOCKED = "blocked", "Blocked"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="step_results")
    index = models.PositiveIntegerField()
    step_id = models.CharField(max_length=63)
    step_type = models.CharField(max_length=20)
    sentence = models.TextField()
    status = models.CharField(max_length=10, choices=Status.choices)
    started_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField()
    url = models.TextField(blank=True)
    title = models.TextField(blank=True)
    error = models.TextField(blank=True)
    observation = models.JSONField(null=True, blank=True)
    observation_chars = models.PositiveIntegerField(default=0)
    observation_tokens = models.PositiveIntegerField(default=0)
    observation_sha256 = models.CharField(max_length=64, blank=True)
    screenshot = models.CharField(max_length=300, blank=True)
    screenshot_sha256 = models.CharField(max_length=64, blank=True)
    overlay = models.CharField(max_length=300, blank=True)
    thumbnail = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["run", "index"]
        constraints = [
            models.UniqueConstraint(fields=["run", "index"], name="step_result_unique_per_run")
        ]

    def __str__(self) -> str:
        return f"{self.run} step {self.index + 1} ({self.status})"


class RunEvent(models.Model):
    """The append-only log of a run. Every message to a browser is one of these first, so a
    client that reconnects replays what it missed from here."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=40)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="run_event_seq_unique")]

    def __str__(self) -> str:
        return f"{self.run} #{self.seq} {self.type}"


class Artifact(models.Model):
    """A file a run produced (a download), kept with its hash."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="artifacts")
    step_index = models.PositiveIntegerField()
    name = models.CharField(max_length=63)
    filename = models.CharField(max_length=255)
    path = models.CharField(max_length=300)
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "step_index"]

    def __str__(self) -> str:
        return f"{self.name} ({self.filename})"
