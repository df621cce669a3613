from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from celery.signals import worker_process_init, worker_ready

from sessions import services
from sessions.models import Run, SessionTemplate
from sessions.services import scratch

logger = logging.getLogger(__name__)


# No automatic retry: a run that failed half way may have done something real.
@shared_task(name="runs.execute", ignore_result=True, acks_late=False)
def run_execute_task(*, run_id: int) -> None:
    from sessions.services import execution

    if not Run.objects.filter(pk=run_id).exists():
        logger.warning("run %s is gone; nothing to execute", run_id)
        return
    execution.run_execute(run_id=run_id)


# No retry either: a continuation performs an approved irreversible action at most once.
@shared_task(name="runs.continue", ignore_result=True, acks_late=False)
def run_continue_task(*, run_id: int, approval_id: int) -> None:
    from sessions.services import execution

    execution.run_continue(run_id=run_id, approval_id=approval_id)


# No retry: the answer (a one-time code) is taken once.
@shared_task(name="runs.answer", ignore_result=True, acks_late=False)
def run_answer_continue_task(*, run_id: int, question_id: int) -> None:
    from sessions.services import execution

    execution.run_answer_continue(run_id=run_id, question_id=question_id)


@shared_task(name="runs.destroy_sandbox", ignore_result=True)
def sandbox_destroy_task(*, sandbox: dict[str, Any]) -> None:
    services.destroy_sandbox(sandbox)


@shared_task(name="runs.reap_sandboxes", ignore_result=True)
def sandboxes_reap_task() -> None:
    from sessions.durability import host_housekeeping

    report = host_housekeeping()
    if any(report.values()):
        logger.info("housekeeping of this host's sandboxes: %s", report)


@worker_process_init.connect
def _warm_driver(**kwargs: Any) -> None:
    # A prefork child (or the solo pool's process) runs the tasks: a continuation it takes
    # right after a deploy then does not wait for a Playwright driver to start.
    from sessions.engine.driver import warm

    warm()


@worker_ready.connect
def _look_after_this_hosts_sandboxes(**kwargs: Any) -> None:
    # Sandboxes live on one machine, so every worker looks after its own host's (beat would
    # reach only one host). Once at start: a worker started by a deploy adopts the runs its
    # predecessors left waiting, and sends again what their death lost.
    from celery.concurrency.thread import TaskPool as ThreadsPool
    from django.conf import settings
    from django.db import connections

    from pandaweb.core.dispatch import start_periodic

    controller = getattr(kwargs.get("sender"), "controller", None)
    pool = getattr(controller, "pool_cls", None)
    if isinstance(pool, type) and issubclass(pool, ThreadsPool):
        _warm_driver()  # the threads pool runs tasks in this process
    try:
        sandboxes_reap_task.apply()
    finally:
        # The worker's main process holds no connection between housekeeping periods.
        for conn in connections.all(initialized_only=True):
            conn.close()
    start_periodic(sandboxes_reap_task, every=float(settings.HOUSEKEEPING_SECONDS))


@shared_task(name="runs.reap", ignore_result=True)
def runs_reap_task() -> None:
    from approvals.services import approval_housekeeping
    from sessions.durability import runs_redispatch_queued

    reaped = services.run_reap()
    if reaped:
        logger.warning("interrupted runs whose worker went quiet: %s", reaped)
    requeued = runs_redispatch_queued()
    if requeued:
        logger.warning("queued runs sent again (their message was lost): %s", requeued)
    done = approval_housekeeping()
    if done["expired"]:
        logger.warning("approval requests expired undecided: %s", done["expired"])
    if done["questions_reminded"]:
        logger.info("questions reminded before their timeout: %s", done["questions_reminded"])
    if done["questions_expired"]:
        logger.warning("questions nobody answered in time: %s", done["questions_expired"])
    scratch_rounds = scratch.scratch_housekeeping()
    if any(scratch_rounds.values()):
        logger.info("scratch sessions ended or freed: %s", scratch_rounds)


@shared_task(name="scratch.start", ignore_result=True, acks_late=False)
def scratch_start_task(*, scratch_id: int) -> None:
    from sessions.services import scratch_worker

    scratch_worker.scratch_start(scratch_id=scratch_id)


# No retry: the author asks again if they want to (a step may have typed into the portal).
@shared_task(name="scratch.act", ignore_result=True, acks_late=False)
def scratch_act_task(
    *,
    scratch_id: int,
    action: str,
    index: int | None,
    steps: list[dict[str, Any]],
    inputs: dict[str, Any],
    element: dict[str, Any] | None,
    skip: dict[str, str],
    work: str,
) -> None:
    from sessions.services import scratch_worker

    scratch_worker.scratch_act(
        scratch_id=scratch_id, action=action, index=index, steps=steps, inputs=inputs,
        element=element, skip=skip, work=work,
    )  # fmt: skip


# No retry: a login that failed (a changed password) must not be tried again and again.
@shared_task(name="runs.bake_session_template", ignore_result=True, acks_late=False)
def session_template_bake_task(*, template_id: int) -> None:
    from sessions.services import baking

    if not SessionTemplate.objects.filter(pk=template_id).exists():
        logger.warning("session template %s is gone; nothing to bake", template_id)
        return
    baking.template_bake(template_id=template_id)


@shared_task(name="runs.discard_session_template_state", ignore_result=True)
def session_template_discard_task(*, path: str) -> None:
    services.template_discard_state(path=path)


@shared_task(name="runs.rebake_session_templates", ignore_result=True)
def session_templates_rebake_task() -> None:
    queued = services.template_rebake_due()
    if queued:
        logger.info("session templates re-baking on schedule: %s", queued)


@shared_task(name="runs.prune_files", ignore_result=True)
def run_files_prune_task() -> None:
    from sessions import retention

    pruned = retention.run_files_prune()
    if pruned:
        logger.info("run files pruned by the retention policy: %s", pruned)
