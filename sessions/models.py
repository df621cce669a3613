from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q

from pandaweb.core.models import Team, default_team_id
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
        # An ``ask`` step waits for a person's answer (a code, a text, a choice).
        AWAITING_ANSWER = "awaiting_answer", "Waiting for an answer"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"
        EXPIRED = "expired", "Expired"
        INTERRUPTED = "interrupted", "Interrupted"
        # An irreversible action was started and its end was never recorded: a person checks
        # the portal and says whether it happened. Never retried automatically.
        NEEDS_RECONCILIATION = "needs_reconciliation", "Needs reconciliation"

    class Priority(models.IntegerChoices):
        LOW = 0, "Low"
        NORMAL = 1, "Normal"
        HIGH = 2, "High"

    FINAL = frozenset({"succeeded", "failed", "cancelled", "expired", "interrupted"})
    ACTIVE = frozenset({"starting", "running", "awaiting_approval", "awaiting_answer"})
    # Waiting for a person, holding no worker: its browser and proxy live on in the sandbox.
    WAITING_FOR_PEOPLE = frozenset({"awaiting_approval", "awaiting_answer"})

    workflow = models.ForeignKey(Workflow, on_delete=models.PROTECT, related_name="runs")
    # The workflow's team when the run was launched: a run stays with the team that ran it, and
    # every list of runs, approvals and questions narrows on this one column.
    team = models.ForeignKey(
        Team, on_delete=models.PROTECT, related_name="runs", default=default_team_id
    )
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
    # Lowercased inputs and outputs, kept by save(): the runs list's search ("INV-2024-0042")
    # works the same on SQLite and PostgreSQL without a JSON path per field.
    search_text = models.TextField(blank=True, default="")
    # "Run again with these inputs" and "continue from step N": the run this one repeats.
    rerun_of = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="reruns"
    )
    # Continue-from: the step index this run starts at (0: from the beginning).
    start_index = models.PositiveIntegerField(default=0)
    # The workflow's queue: a queued run waits for a free slot of its workflow's concurrency
    # limit, highest priority first, then oldest (sessions.services.runstate.queue_release).
    priority = models.PositiveSmallIntegerField(choices=Priority.choices, default=Priority.NORMAL)
    # When a worker was asked to start the run; None while it waits in its workflow's queue.
    dispatched_at = models.DateTimeField(null=True, blank=True)
    # When housekeeping deleted the run's screenshots and downloads (the retention policy); the
    # rows keep their hashes, so the evidence bundle still proves what was there.
    files_pruned_at = models.DateTimeField(null=True, blank=True)

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
            # The runs list's keyset pages, newest first, optionally within one status or
            # workflow (sessions.console.run_page).
            models.Index(fields=["created_at", "id"], name="run_created_keyset"),
            models.Index(fields=["status", "created_at", "id"], name="run_status_keyset"),
            models.Index(fields=["workflow", "created_at", "id"], name="run_workflow_keyset"),
            # The same pages narrowed to a person's teams.
            models.Index(fields=["team", "created_at", "id"], name="run_team_keyset"),
            # Home and triage: failures finished since a moment.
            models.Index(fields=["status", "finished_at"], name="run_status_finished"),
            # Home: my runs by status.
            models.Index(fields=["launched_by", "status"], name="run_launcher_status"),
            # The queue's next run of a workflow, and a waiting run's place in it.
            models.Index(
                fields=["workflow", "-priority", "created_at", "id"],
                condition=Q(status="queued", dispatched_at=None),
                name="run_queue_order",
            ),
        ]

    def __str__(self) -> str:
        return f"Run #{self.pk} of {self.workflow}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.search_text = run_search_text(self.inputs, self.outputs)
        update_fields = kwargs.get("update_fields")
        if update_fields is not None and {"inputs", "outputs"} & set(update_fields):
            kwargs["update_fields"] = {*update_fields, "search_text"}
        super().save(*args, **kwargs)

    @property
    def is_final(self) -> bool:
        return self.status in self.FINAL

    @property
    def waits_for_slot(self) -> bool:
        """Queued behind its workflow's concurrency limit (not yet handed to a worker)."""
        return self.status == self.Status.QUEUED and self.dispatched_at is None

    @property
    def duration_seconds(self) -> float | None:
        if self.started_at is None:
            return None
        end = self.finished_at
        if end is None:
            return None
        return (end - self.started_at).total_seconds()


def run_search_text(inputs: Any, outputs: Any) -> str:
    """What the runs list searches: every input and output value (and name), lowercased."""
    parts: list[str] = []
    for data in (inputs, outputs):
        if isinstance(data, dict):
            for key, value in data.items():
                text = value if isinstance(value, str) else json.dumps(value, default=str)
                parts.append(f"{key}={text}")
    return "\n".join(parts).lower()[:20000]


class SavedRunView(models.Model):
    """A person's named runs-list filter: the query string of the list, kept as typed."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="saved_run_views"
    )
    name = models.CharField(max_length=80)
    query = models.CharField(max_length=1000)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["user", "name"], name="saved_run_view_unique_name")
        ]

    def __str__(self) -> str:
        return self.name


class RunSeen(models.Model):
    """A person has seen how their run ended (opened its page or dismissed it from the home
    page), so the home page stops holding it up to them."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="seen_marks")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    seen_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # Also the index of the home page's "not yet seen by this person" exclusion.
            models.UniqueConstraint(fields=["run", "user"], name="run_seen_once_per_person")
        ]

    def __str__(self) -> str:
        return f"{self.run} seen by user {self.user_id}"


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

    @property
    def elements(self) -> list[dict[str, Any]]:
        """The numbered elements of the page the step's observation recorded (none when it
        recorded no page)."""
        return list((self.observation or {}).get("elements") or [])


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


class ControlSession(models.Model):
    """A person's control of a run's browser between two steps: who, when, and what they did.

    The inputs and a frame a second are the session's evidence (``files_dir`` under the run's
    files); the audit trail holds its opening and its closing with the inputs.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="control_sessions")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    # The step the runner paused before.
    step_index = models.PositiveIntegerField()
    opened_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    close_reason = models.CharField(max_length=200, blank=True)
    # Every input event as sent to the browser (keys typed into secret fields are refused, so
    # never here), in order.
    inputs = models.JSONField(default=list, blank=True)
    navigated = models.BooleanField(default=False)
    typed = models.BooleanField(default=False)
    urls = models.JSONField(default=list, blank=True)
    frames = models.PositiveIntegerField(default=0)
    # Relative to the run's files directory.
    files_dir = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            # One controller at a time, whatever the processes that ask.
            models.UniqueConstraint(
                fields=["run"],
                condition=Q(closed_at__isnull=True),
                name="control_session_one_open_per_run",
            ),
        ]

    def __str__(self) -> str:
        return f"Control of run #{self.run_id} by {self.user}"


class ScratchSession(models.Model):
    """A browser of a workflow's backend, behind its allowlist, where a person tries the draft's
    steps and points at elements to write targets. Nothing irreversible is ever done in it; it
    is time-limited and destroyed on closing or expiry."""

    class Status(models.TextChoices):
        STARTING = "starting", "Starting"
        READY = "ready", "Ready"
        BUSY = "busy", "Working"
        CLOSED = "closed", "Closed"
        EXPIRED = "expired", "Expired"
        FAILED = "failed", "Failed"

    OPEN = frozenset({Status.STARTING, Status.READY, Status.BUSY})

    workflow = models.ForeignKey(
        Workflow, on_delete=models.CASCADE, related_name="scratch_sessions"
    )
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.STARTING)
    backend = models.CharField(max_length=20, default="local")
    sandbox = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)
    # What it is doing now, in words ("running steps 1 to 3"), and since when, while busy.
    doing = models.CharField(max_length=200, blank=True)
    busy_since = models.DateTimeField(null=True, blank=True)
    # Each step's last result here, by the step's id: status, sentence, error, picture.
    results = models.JSONField(default=dict, blank=True)
    # The page as last seen: its picture (a file of the session's directory), address and
    # observation, on which a person points at elements.
    picture = models.CharField(max_length=100, blank=True)
    url = models.CharField(max_length=2000, blank=True)
    observation = models.JSONField(null=True, blank=True)
    # The element last pointed at and the targets proposed for it, or why there are none.
    picked = models.JSONField(null=True, blank=True)
    # The hosts the allowlist kept the browser from, with how often: {host: count}.
    refused = models.JSONField(default=dict, blank=True)
    # Bumped by every finished piece of work: the page re-reads what changed.
    seq = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-pk"]
        indexes = [models.Index(fields=["status", "expires_at"], name="scratch_status_expiry")]

    def __str__(self) -> str:
        return f"Scratch session #{self.pk} of {self.workflow}"

    @property
    def is_open(self) -> bool:
        return self.status in self.OPEN
