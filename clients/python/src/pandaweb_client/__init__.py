"""A typed client for pandaweb's HTTP API (``/api/v1/``), and the ``pandaweb`` command."""

from pandaweb_client.client import (
    FINAL_STATUSES,
    WAITING_STATUSES,
    ApiError,
    Approval,
    Batch,
    Client,
    Credential,
    Draft,
    Event,
    Run,
    Schedule,
    SessionTemplate,
    Version,
    Webhook,
    Workflow,
)

__all__ = [
    "FINAL_STATUSES",
    "WAITING_STATUSES",
    "ApiError",
    "Approval",
    "Batch",
    "Client",
    "Credential",
    "Draft",
    "Event",
    "Run",
    "Schedule",
    "SessionTemplate",
    "Version",
    "Webhook",
    "Workflow",
]
