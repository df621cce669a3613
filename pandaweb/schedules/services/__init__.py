"""Schedules (launch on a cron expression) and batches (launch the rows of a CSV file), one
module each; every public name is importable from here."""

from __future__ import annotations

from pandaweb.schedules.services.batches import (
    BatchRefused,
    CheckedRows,
    RowProblem,
    batch_check_rows,
    batch_create,
    batch_create_once,
    batch_outputs_csv,
    batch_parse,
    batch_release,
    batches_release_all,
    csv_safe,
)
from pandaweb.schedules.services.schedules import (
    MISSED_AFTER,
    OCCUPYING,
    ScheduleError,
    ScheduleSpec,
    schedule_create,
    schedule_delete,
    schedule_fire,
    schedule_set_paused,
    schedule_update,
    schedules_tick,
)

__all__ = [
    "MISSED_AFTER",
    "OCCUPYING",
    "BatchRefused",
    "CheckedRows",
    "RowProblem",
    "ScheduleError",
    "ScheduleSpec",
    "batch_check_rows",
    "batch_create",
    "batch_create_once",
    "batch_outputs_csv",
    "batch_parse",
    "batch_release",
    "batches_release_all",
    "csv_safe",
    "schedule_create",
    "schedule_delete",
    "schedule_fire",
    "schedule_set_paused",
    "schedule_update",
    "schedules_tick",
]
