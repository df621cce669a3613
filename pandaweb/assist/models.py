from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from sessions.models import Run, ScratchSession


class ModelCall(models.Model):
    """One question to the configured model, asked for a person on the healing page of a run's
    failed step or in their scratch session: recorded when they ask, answered by a worker (the
    web process never loads the model's client), read by the page, which waits for it."""

    class Purpose(models.TextChoices):
        # The labels are the audit trail's words for the call.
        RANK = "rank", "rank healing candidates"
        CHOOSE = "choose", "choose an element"
        DRAFT = "draft", "draft steps"

    class Status(models.TextChoices):
        PENDING = "pending", "Asking"
        ANSWERED = "answered", "Answered"
        FAILED = "failed", "Failed"
        # Drafted steps a person added to the draft: not added twice.
        ADDED = "added", "Added to the draft"

    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    # What the question is about: a run's step (its index, and which of its targets: the
    # ``target_field``), or a scratch session's page (``target_field`` is then the picture of
    # the page asked about: the answer is read against that page only).
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="model_calls", null=True, blank=True
    )
    scratch = models.ForeignKey(
        ScratchSession,
        on_delete=models.CASCADE,
        related_name="model_calls",
        null=True,
        blank=True,
    )
    step_index = models.PositiveIntegerField(null=True, blank=True)
    target_field = models.CharField(max_length=40, blank=True)
    purpose = models.CharField(max_length=10, choices=Purpose.choices)
    # The person's words, when they described the element.
    description = models.CharField(max_length=300, blank=True)
    # The words the worker sends, as the web side wrote them: page words only, no typed value,
    # no secret (less than the step's recorded observation already holds).
    prompt = models.TextField()
    # The element numbers the prompt offered: the answer is read against these only.
    offered = models.JSONField(default=list)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    # The model that answered, as the worker was configured.
    model_name = models.CharField(max_length=200, blank=True)
    answer = models.TextField(blank=True)
    # Why there is no answer, in people's words.
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    answered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(status="pending", answered_at__isnull=True)
                | (~Q(status="pending") & Q(answered_at__isnull=False)),
                name="model_call_answered_when_settled",
            ),
            models.CheckConstraint(
                condition=~Q(status="failed") | ~Q(error=""),
                name="model_call_failure_says_why",
            ),
            models.CheckConstraint(
                condition=Q(run__isnull=False, scratch__isnull=True)
                | Q(run__isnull=True, scratch__isnull=False),
                name="model_call_about_a_run_or_a_scratch_session",
            ),
        ]

    def __str__(self) -> str:
        about = f"run #{self.run_id}" if self.run_id else f"scratch session #{self.scratch_id}"
        return f"Model call #{self.pk} ({self.get_purpose_display()}) for {about}"

    @property
    def about(self) -> tuple[str, int]:
        """The audit trail's object the call is about."""
        if self.run_id is not None:
            return "run", self.run_id
        assert self.scratch_id is not None
        return "scratch_session", self.scratch_id

    @property
    def about_team_id(self) -> int | None:
        """The team of what the call is about (its run's, its scratch session's workflow's), for
        the audit trail."""
        if self.run is not None:
            return self.run.team_id
        assert self.scratch is not None
        return self.scratch.workflow.team_id

    @property
    def prompt_chars(self) -> int:
        return len(self.prompt)
