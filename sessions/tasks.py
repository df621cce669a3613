from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from sessions import services
from sessions.models import Run

logger = logging.getLogger(__name__)


# No automatic retry: a run that failed half way may have done something real.
@shared_task(name="runs.execute", ignore_result=True, acks_late=False)
def run_execute_task(*, run_id: int) -> None:
    if not Run.objects.filter(pk=run_id).exists():
        logger.warning("run %s is gone; nothing to execute", run_id)
        return
    services.run_execute(run_id=run_id)


# No retry either: a continuation performs an approved irreversible action at most once.
@shared_task(name="runs.continue", ignore_result=True, acks_late=False)
def run_continue_task(*, run_id: int, approval_id: int) -> None:
    services.run_continue(run_id=run_id, approval_id=approval_id)


@shared_task(name="runs.destroy_sandbox", ignore_result=True)
def sandbox_destroy_task(*, sandbox: dict[str, Any]) -> None:
    services.destroy_sandbox(sandbox)


@shared_task(name="runs.reap", ignore_result=True)
def runs_reap_task() -> None:
    from approvals.services import approval_expire_due

    reaped = services.run_reap()
    if reaped:
        logger.warning("interrupted runs whose worker went quiet: %s", reaped)
    expired = approval_expire_due()
    if expired:
        logger.warning("approval requests expired undecided: %s", expired)
