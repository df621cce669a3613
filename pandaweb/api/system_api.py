"""The system page over the API: what the installation runs on, its workers and its queues, read
by the same selectors as the page, with its capability (through the scope ``system:read``)."""

from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest
from django.utils import timezone
from ninja import Router, Schema, Status
from pydantic import Field

from pandaweb.api.access import token_with_scope
from pandaweb.api.scopes import Scope
from pandaweb.core.selectors import deployment_summary, heartbeat_list
from pandaweb.core.services import workers_ping
from sessions import console, retention

router = Router(tags=["system"])


class WorkerOut(Schema):
    worker: str
    mode: str = Field(description="thread (in the dashboard's process) or celery.")
    pid: int
    database: str
    seen_at: datetime = Field(description="Its last answer to a ping or its own heartbeat.")
    seconds_since_seen: int
    ping_nonce: str


class OldestQueuedOut(Schema):
    run: int
    workflow: str
    queued_since: datetime


class WorkflowQueueOut(Schema):
    workflow: str
    waiting: int
    running: int
    limit: int = Field(description="The workflow's runs at once.")
    oldest_run: int
    oldest_since: datetime


class ExpiringApprovalOut(Schema):
    id: int
    run: int
    workflow: str
    expires_at: datetime | None


class HealthOut(Schema):
    database: str = Field(description="The database's vendor: postgresql or sqlite.")
    channel_layer: str = Field(description="RedisChannelLayer, or InMemoryChannelLayer.")
    execution: str = Field(description="thread (in-process) or celery (workers).")
    run_threads: int | None
    embedded: bool = Field(description="One machine: SQLite and in-process threads.")
    workers: list[WorkerOut]
    queued: int = Field(description="Queue depth: runs waiting for a worker or a slot.")
    active: int
    oldest_queued: OldestQueuedOut | None
    queues: list[WorkflowQueueOut] = Field(
        description="Workflows with runs waiting for a slot, longest queue first."
    )
    sandboxes_by_host: dict[str, int]
    scratch_sessions_open: int
    scratch_sessions_max: int
    run_files: int
    run_files_bytes: int
    retention_days: int = Field(description="0: run files are kept forever.")
    approvals_expiring: list[ExpiringApprovalOut] = Field(
        description="Pending approvals that expire within 15 minutes."
    )


class PingOut(Schema):
    nonce: str = Field(description="Workers answer with it: see each worker's ping_nonce.")


@router.get("/health", response=HealthOut, url_name="system_health", summary="System health")
def system_health(request: HttpRequest) -> HealthOut:
    """What the system page shows: the database and channel layer in use, how runs execute,
    each worker's last answer, queue depth with the oldest queued run and the queues per
    workflow, live sandboxes per host, scratch sessions, run files on disk, approvals about to
    expire. Scope: ``system:read``."""
    token_with_scope(request, Scope.SYSTEM_READ)
    deployment = deployment_summary()
    capacity = console.capacity()
    files, size = retention.run_files_usage()
    now = timezone.now()
    oldest = capacity.oldest_queued
    return HealthOut(
        database=deployment["database"],
        channel_layer=deployment["channel_layer"],
        execution=deployment["execution"],
        run_threads=deployment["run_threads"],
        embedded=deployment["embedded"],
        workers=[
            WorkerOut(
                worker=beat.worker,
                mode=beat.mode,
                pid=beat.pid,
                database=beat.database_vendor,
                seen_at=beat.seen_at,
                seconds_since_seen=max(0, int((now - beat.seen_at).total_seconds())),
                ping_nonce=beat.ping_nonce,
            )
            for beat in heartbeat_list()
        ],
        queued=capacity.queued,
        active=capacity.active,
        oldest_queued=OldestQueuedOut(
            run=oldest.pk, workflow=oldest.workflow.slug, queued_since=oldest.created_at
        )
        if oldest is not None
        else None,
        queues=[
            WorkflowQueueOut(
                workflow=q.workflow.slug,
                waiting=q.waiting,
                running=q.occupying,
                limit=q.limit,
                oldest_run=q.oldest_run_id,
                oldest_since=q.oldest_since,
            )
            for q in capacity.queues
        ],
        sandboxes_by_host=dict(capacity.sandboxes_by_host),
        scratch_sessions_open=capacity.scratch_open,
        scratch_sessions_max=capacity.scratch_max,
        run_files=files,
        run_files_bytes=size,
        retention_days=capacity.retention_days,
        approvals_expiring=[
            ExpiringApprovalOut(
                id=a.pk, run=a.run_id, workflow=a.run.workflow.slug, expires_at=a.expires_at
            )
            for a in capacity.expiring
        ],
    )


@router.post(
    "/workers/ping", response={202: PingOut}, url_name="system_ping", summary="Ping the workers"
)
def system_ping(request: HttpRequest) -> Status[PingOut]:
    """Ask every worker to answer, as the system page's button: each that does shows the nonce
    as its ``ping_nonce`` in ``GET /system/health`` moments later. Scope: ``system:read``."""
    token_with_scope(request, Scope.SYSTEM_READ)
    return Status(202, PingOut(nonce=workers_ping()))
