"""The run services, by seam. ``runstate`` is the only run API other apps use; the rest is
launch/cancel/reconcile/reap (``launch``), execution (``execution``), the worker-side record
writer and heartbeat (``writer``) and session templates (``templates``). The package
exports their public names; what a module keeps private is imported from that module."""

from __future__ import annotations

from sessions.services.control import (
    control_close,
    control_close_open_sessions,
    control_open,
)
from sessions.services.execution import (
    run_answer_continue,
    run_continue,
    run_execute,
    run_fail_waiting,
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
    template_bake,
    template_discard_state,
    template_mark_stale,
    template_rebake_due,
    template_request_bake,
    template_retire,
    template_states_reencrypt,
    templates_dir,
)
from sessions.services.writer import (
    _sha256,
    run_record_action,
    run_record_denial,
    run_record_step,
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
    "_sha256",
    "coerce_inputs",
    "concurrency_limit",
    "control_close",
    "control_close_open_sessions",
    "control_open",
    "destroy_sandbox",
    "host_queue",
    "installation_tag",
    "lock_run",
    "lock_template",
    "parse_priority",
    "queue_position",
    "queue_release",
    "queues_release_all",
    "run_answer_continue",
    "run_cancel",
    "run_continue",
    "run_enqueue",
    "run_execute",
    "run_fail_waiting",
    "run_files_dir",
    "run_launch",
    "run_launch_once",
    "run_reap",
    "run_reconcile",
    "run_record_action",
    "run_record_denial",
    "run_record_step",
    "sandbox_reap_orphans",
    "sandbox_run_key",
    "template_bake",
    "template_discard_state",
    "template_mark_stale",
    "template_rebake_due",
    "template_request_bake",
    "template_retire",
    "template_states_reencrypt",
    "templates_dir",
    "transition",
]
