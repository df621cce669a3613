from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models.functions import Length
from django.db.models.lookups import Exact

from pandaweb.audit.chain import HASHED_FIELDS, TEAM_FIELDS


class AuditEvent(models.Model):
    """One thing that happened, in a hash chain with every event before it.

    Append-only: written only by ``services.audit_record`` (inside the transaction of the change it
    records), refused UPDATE, DELETE and TRUNCATE by database triggers (migration 0002). The hash
    chain (``chain.py``) detects what the triggers cannot stop: someone with direct database
    access dropping them and editing rows.

    ``run_id``, ``step_id`` and ``approval_id`` are plain columns, not foreign keys: the trail must
    outlive what it describes, and a foreign key would let a cascade touch it.
    """

    class ActorKind(models.TextChoices):
        USER = "user", "User"
        RUNNER = "runner", "Runner"
        SYSTEM = "system", "System"

    sequence = models.PositiveBigIntegerField(unique=True)
    occurred_at = models.DateTimeField()
    actor_kind = models.CharField(max_length=10, choices=ActorKind.choices)
    # PROTECT: a person with a history in the trail is deactivated, never deleted.
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="audit_events",
    )
    # The username when it happened: the record stays readable after a rename.
    actor_label = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=100, db_index=True)  # the trail filtered by action
    object_type = models.CharField(max_length=100)
    object_id = models.CharField(max_length=100)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    request_id = models.CharField(max_length=100, blank=True)
    client_ip = models.GenericIPAddressField(null=True, blank=True)
    run_id = models.BigIntegerField(null=True, blank=True)
    step_id = models.BigIntegerField(null=True, blank=True)
    approval_id = models.BigIntegerField(null=True, blank=True)
    # The team whose workflow, run, credential or subscription this is about; none for what
    # belongs to the whole installation (people, tokens, the system).
    team_id = models.BigIntegerField(null=True, blank=True)
    extra = models.JSONField(default=dict, blank=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    # The team's own chain (chain.py), so a team's trail verifies without the other teams'
    # events: null on events without a team and on those written before team chains existed.
    # Null, not "": SQLite adds a nullable column without a default in place, where a default or
    # a constraint (like the global hashes' length checks) would rebuild the table, dropping the
    # append-only triggers; and null says "on no team chain" without a magic value.
    team_prev_hash = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    team_hash = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001

    class Meta:
        ordering = ["sequence"]
        indexes = [
            # The run page's timeline: every event of one run, in order.
            models.Index(
                fields=["run_id", "sequence"],
                name="audit_run_timeline",
                condition=models.Q(run_id__isnull=False),
            ),
            # A step's history (attempts, observations, its approval) on the step detail.
            models.Index(
                fields=["step_id", "sequence"],
                name="audit_step_timeline",
                condition=models.Q(step_id__isnull=False),
            ),
            # An approval's history (requested, evidence, decided, expired) on its decision page.
            models.Index(
                fields=["approval_id", "sequence"],
                name="audit_approval_timeline",
                condition=models.Q(approval_id__isnull=False),
            ),
            # "Everything that happened to this workflow / credential", newest first.
            models.Index(
                fields=["object_type", "object_id", "sequence"], name="audit_object_history"
            ),
            # A team's trail and its export, in order.
            models.Index(
                fields=["team_id", "sequence"],
                name="audit_team_trail",
                condition=models.Q(team_id__isnull=False),
            ),
            # Export and the trail page filtered by a time window.
            models.Index(fields=["occurred_at"], name="audit_occurred_at"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(sequence__gte=1), name="audit_sequence_gte_1"
            ),
            models.CheckConstraint(
                condition=models.Q(actor_kind__in=["user", "runner", "system"]),
                name="audit_actor_kind_valid",
            ),
            # A user event without its user could not be attributed to anyone.
            models.CheckConstraint(
                condition=~models.Q(actor_kind="user") | models.Q(actor__isnull=False),
                name="audit_user_event_has_actor",
            ),
            models.CheckConstraint(condition=Exact(Length("hash"), 64), name="audit_hash_length"),
            models.CheckConstraint(
                condition=Exact(Length("prev_hash"), 64), name="audit_prev_hash_length"
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.sequence} {self.action} {self.object_type}:{self.object_id}"

    def chain_fields(self) -> dict[str, Any]:
        """The event as ``chain.verify`` reads it: the hashed fields and the hashes."""
        fields = {name: getattr(self, name) for name in (*HASHED_FIELDS, *TEAM_FIELDS)}
        fields["hash"] = self.hash
        fields["team_hash"] = self.team_hash
        return fields
