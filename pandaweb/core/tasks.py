from __future__ import annotations

from celery import shared_task

from pandaweb.core import services
from pandaweb.core.models import WorkerHeartbeat


@shared_task(name="core.worker_ping", ignore_result=True)
def worker_ping(*, nonce: str) -> None:
    request = worker_ping.request
    if request.is_eager:
        services.heartbeat_record(
            mode=WorkerHeartbeat.Mode.THREAD, worker=services.thread_worker_name(), nonce=nonce
        )
    else:
        services.heartbeat_record(
            mode=WorkerHeartbeat.Mode.CELERY, worker=str(request.hostname), nonce=nonce
        )
