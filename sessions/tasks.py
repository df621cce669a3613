from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from celery.signals import worker_ready

from sessions import services
from sessions.models import Run, SessionTemplate

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


@shared_task(name="runs.reap_sandboxes", ignore_result=True)
def sandboxes_reap_task() -> None:
    reaped = services.sandbox_reap_orphans()
    if reaped:
        logger.warning("destroyed sandboxes left past their deadline: %s", reaped)


@worker_ready.connect
def _reap_this_hosts_sandboxes(**kwargs: Any) -> None:
    # Sandboxes live on one machine, so every worker reaps its own host's (beat would reach
    # only one host).
    from pandaweb.core.dispatch import start_periodic

    start_periodic(sandboxes_reap_task, every=60.0)


@shared_task(name="runs.reap", ignore_result=True)
def runs_reap_task() -> None:
    from approvals.services import approval_expire_due

    reaped = services.run_reap()
    if reaped:
        logger.warning("interrupted runs whose worker went quiet: %s", reaped)
    expired = approval_expire_due()
    if expired:
        logger.warning("approval requests expired undecided: %s", expired)


# No retry: a login that failed (a changed password) must not be tried again and again.
@shared_task(name="runs.bake_session_template", ignore_result=True, acks_late=False)
def session_template_bake_task(*, template_id: int) -> None:
    if not SessionTemplate.objects.filter(pk=template_id).exists():
        logger.warning("session template %s is gone; nothing to bake", template_id)
        return
    services.template_bake(template_id=template_id)


@shared_task(name="runs.discard_session_template_state", ignore_result=True)
def session_template_discard_task(*, path: str) -> None:
    services.template_discard_state(path=path)


@shared_task(name="runs.rebake_session_templates", ignore_result=True)
def session_templates_rebake_task() -> None:
    queued = services.template_rebake_due()
    if queued:
        logger.info("session templates re-baking on schedule: %s", queued)
