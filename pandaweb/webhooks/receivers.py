"""What the webhooks app learns from the run core: a run that waits for people or settles gets a
message in the outbox, in the transaction that moved it (so the message carries its new status)."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from pandaweb.webhooks.services import outbox_record_run
from sessions.models import Run
from sessions.signals import run_transitioned

ANNOUNCED = frozenset({*Run.FINAL, Run.Status.NEEDS_RECONCILIATION, Run.Status.AWAITING_APPROVAL})


@receiver(run_transitioned, dispatch_uid="webhooks.run_transitioned")
def announce_run(sender: type[Run], *, run: Run, to: str, **kwargs: Any) -> None:
    if to in ANNOUNCED:
        outbox_record_run(run=run)
