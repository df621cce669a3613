"""The run services, by seam. ``runstate`` is the only run API other apps use; the rest is
launch/cancel/reconcile/reap (``launch``), control sessions (``control``) and session
templates (``templates``). The package exports their public names.

The worker's side is not exported: ``execution`` (a run), ``baking`` (a session template) and
``writer`` (a run's records and heartbeat) load the engine, so only the tasks import them, inside
their bodies, and a web process never loads Playwright."""

from __future__ import annotations

from sessions.services.control import (
    control_close,
    control_close_open_sessions,
    control_open,
    control_request_withdraw,
    control_unavailable,
)
from sessions.services.launch import (
    coerce_inputs,
    parse_priority,
    run_cancel,
    run_enqueue,
    run_launch,
    run_launch_once,
    run_reap,
    run_reconcile,
    run_replayed,
    sandbox_reap_orphans,
)
from sessions.services.records import lock_run
from sessions.services.runstate import (
    IDEMPOTENCY_KEY_MAX_LENGTH,
    IdempotencyKeyReused,
    RunError,
    S,
    TransitionRefused,
    concurrency_limit,
    destroy_sandbox,
    host_queue,
    installation_tag,
    queue_position,
    queue_release,
    queues_release_all,
    run_files_dir,
    sandbox_run_key,
    transition,
)
from sessions.services.templates import (
    BAKE_START_PATIENCE,
    T,
    TemplateError,
    lock_template,
    template_discard_state,
    template_mark_stale,
    template_rebake_due,
    template_request_bake,
    template_retire,
    template_states_reencrypt,
    templates_dir,
)

__all__ = [
    "BAKE_START_PATIENCE",
    "IDEMPOTENCY_KEY_MAX_LENGTH",
    "IdempotencyKeyReused",
    "RunError",
    "S",
    "T",
    "TemplateError",
    "TransitionRefused",
    "coerce_inputs",
    "concurrency_limit",
    "control_close",
    "control_close_open_sessions",
    "control_open",
    "control_request_withdraw",
    "control_unavailable",
    "destroy_sandbox",
    "host_queue",
    "installation_tag",
    "lock_run",
    "lock_template",
    "parse_priority",
    "queue_position",
    "queue_release",
    "queues_release_all",
    "run_cancel",
    "run_enqueue",
    "run_files_dir",
    "run_launch",
    "run_launch_once",
    "run_reap",
    "run_reconcile",
    "run_replayed",
    "sandbox_reap_orphans",
    "sandbox_run_key",
    "template_discard_state",
    "template_mark_stale",
    "template_rebake_due",
    "template_request_bake",
    "template_retire",
    "template_states_reencrypt",
    "templates_dir",
    "transition",
]
