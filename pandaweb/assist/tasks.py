from __future__ import annotations

import logging

from celery import shared_task

from pandaweb.assist.models import ModelCall

logger = logging.getLogger(__name__)


# No retry: a person is waiting on the page; a failed call says why there, and they may ask again.
@shared_task(name="assist.ask", ignore_result=True)
def model_call_task(*, call_id: int) -> None:
    from pandaweb.assist import calling

    if not ModelCall.objects.filter(pk=call_id).exists():
        logger.warning("model call %s is gone; nothing to ask", call_id)
        return
    calling.model_call_answer(call_id=call_id)
