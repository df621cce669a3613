from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from sessions.models import Run
from workflows.models import Workflow


class Schedule(models.Model):
    """Launch a workflow's published version on a cron expression in a time zone, with fixed
    inputs, as the person who made the schedule."""

    class Overlap(models.TextChoices):
        SKIP = "skip", "Skip the tick while the previous run is still active"
        QUEUE_ONE = "queue_one", "Queue one run to start when the previous one ends"

    class Missed(models.TextChoices):
        RUN_ONCE = "run_once", "Run once for all the ticks missed while pandaweb was down"
        SKIP = "skip", "Skip the ticks missed while pandaweb was down"

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="schedules")
    name = models.CharField(max_length=200)
    cron = models.CharField(max_length=120)
    timezone = models.CharField(max_length=64, default="UTC")
    inputs = models.JSONField(default=dict)
    overlap = models.CharField(max_length=10, choices=Overlap.choices, default=Overlap.SKIP)
    missed = models.CharField(max_length=10, choices=Missed.choices, default=Missed.RUN_ONCE)
    paused = models.BooleanField(default=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    # The claim: a firing moves this forward with a conditional update, so one tick fires once
    # however many schedulers look at it.
    next_fire_at = models.DateTimeField(null=True, blank=True)
    last_fired_at = models.DateTimeField(null=True, blank=True)
    last_run = models.ForeignKey(
        Run, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # Set when a tick found the previous run active under "queue one": launched when it ends.
    queued_at = models.DateTimeField(null=True, blank=True)
    last_outcome = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["workflow", "name", "pk"]
        indexes = [
            # The scheduler's tick: unpaused schedules that are due.
            models.Index(fields=["next_fire_at"], condition=Q(paused=False), name="schedule_due"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.cron} {self.timezone})"


class Batch(models.Model):
    """Runs launched together from the rows of one uploaded CSV file."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="batches")
    version_number = models.PositiveIntegerField()
    filename = models.CharField(max_length=255)
    columns = models.JSONField(default=list)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # A launch retried with the same key (per person) answers with this batch instead of
    # launching its rows again; the digest is of the request, so another request with the key is
    # told apart from a retry.
    idempotency_key = models.CharField(max_length=100, blank=True)
    request_sha256 = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["created_by", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="batch_idempotency_key_unique_per_user",
            ),
        ]

    def __str__(self) -> str:
        return f"Batch #{self.pk} of {self.workflow}"


class BatchRow(models.Model):
    """One line of a batch's file: waiting for a free slot, launched, or refused at launch."""

    class Status(models.TextChoices):
        WAITING = "waiting", "Waiting for a free slot"
        LAUNCHED = "launched", "Launched"
        REFUSED = "refused", "Could not launch"
        # Kept back when the batch was made (launching only the valid rows): ``problems`` says why.
        INVALID = "invalid", "Not valid, not launched"

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="rows")
    # The line of the file (the header is line 1), so people find it in their spreadsheet.
    line = models.PositiveIntegerField()
    inputs = models.JSONField(default=dict)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.WAITING)
    run = models.ForeignKey(Run, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    error = models.CharField(max_length=500, blank=True)
    # What was wrong with an invalid row: [{"field": parameter or "", "message": …}].
    problems = models.JSONField(default=list, blank=True)
    launched_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["batch", "line"]
        constraints = [
            models.UniqueConstraint(fields=["batch", "line"], name="batch_row_line_unique"),
        ]
        indexes = [
            # The release: waiting rows of a workflow's batches, in upload order.
            models.Index(fields=["status", "batch", "line"], name="batch_row_waiting"),
        ]

    def __str__(self) -> str:
        return f"{self.batch} line {self.line} ({self.get_status_display()})"
