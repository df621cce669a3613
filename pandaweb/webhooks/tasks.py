from __future__ import annotations

import logging

from celery import shared_task

logger = logging.getLogger(__name__)


# No Celery retry: the outbox row carries its own schedule of attempts (and the drain picks up
# whatever a lost task left behind).
@shared_task(name="webhooks.deliver", ignore_result=True)
def webhook_deliver_task(*, message_id: int, manual: bool = False) -> None:
    from pandaweb.webhooks import services
    from pandaweb.webhooks.models import Message

    if not Message.objects.filter(pk=message_id).exists():
        logger.warning("webhook message %s is gone; nothing to deliver", message_id)
        return
    services.message_deliver(message_id=message_id, manual=manual)


@shared_task(name="webhooks.drain", ignore_result=True)
def webhooks_drain_task() -> None:
    from pandaweb.webhooks import services

    services.messages_drain()
