from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from sessions.models import Run


class ModelCall(models.Model):
    """One question to the configured model, asked for a person on the healing page of a run's
    failed step: recorded when they ask, answered by a worker (the web process never loads the
    model's client), read by the page, which waits for it."""

    class Purpose(models.TextChoices):
        # The labels are the audit trail's words for the call.
        RANK = "rank", "rank healing candidates"
        CHOOSE = "choose", "choose an element"

    class Status(models.TextChoices):
        PENDING = "pending", "Asking"
        ANSWERED = "answered", "Answered"
        FAILED = "failed", "Failed"

    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="model_calls")
    # The run's step (its index) and the target of it the question is about.
    step_index = models.PositiveIntegerField()
    target_field = models.CharField(max_length=40)
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
        ]

    def __str__(self) -> str:
        return f"Model call #{self.pk} ({self.get_purpose_display()}) for run #{self.run_id}"

    @property
    def prompt_chars(self) -> int:
        return len(self.prompt)
