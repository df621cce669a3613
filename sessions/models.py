from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from workflows.models import Workflow, WorkflowVersion


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
