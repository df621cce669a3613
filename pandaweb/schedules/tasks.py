from __future__ import annotations

import logging

from celery import shared_task

logger = logging.getLogger(__name__)


# No retry: every firing is claimed once; the next tick picks up anything left.
@shared_task(name="schedules.tick", ignore_result=True)
def schedules_tick_task() -> None:
    from pandaweb.schedules import services

    fired = services.schedules_tick()
    if fired:
        logger.info("schedules fired: %s", fired)
    services.batches_release_all()
