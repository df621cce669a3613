from __future__ import annotations

import logging

from celery import shared_task

logger = logging.getLogger(__name__)


@shared_task(name="audit.checkpoint", ignore_result=True)
def audit_checkpoint_task() -> None:
    from pandaweb.audit.checkpoints import audit_checkpoint_write

    checkpoint = audit_checkpoint_write(reason="interval")
    if checkpoint is not None:
        logger.info("audit checkpoint at sequence %s: %s", checkpoint.sequence, checkpoint.path)
