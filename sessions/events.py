"""Messages about runs on the channel layer. Every message is a RunEvent row first; the channel
message only says "run N has events up to seq S", and consumers read the rows, so a message that
is lost, late or doubled never loses or repeats anything on screen."""

from __future__ import annotations

from typing import Literal, TypedDict

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

RUNS_GROUP = "runs.all"


def run_group(run_id: int) -> str:
    return f"runs.{run_id}"


class RunEventsAvailable(TypedDict):
    type: Literal["run.events"]
    run_id: int
    seq: int


class RunChanged(TypedDict):
    type: Literal["runs.changed"]
    run_id: int


def publish_run_events(run_id: int, seq: int) -> None:
    """After commit: tell the run's viewers and the runs list that new events exist."""
    available: RunEventsAvailable = {"type": "run.events", "run_id": run_id, "seq": seq}
    changed: RunChanged = {"type": "runs.changed", "run_id": run_id}

    def send() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        async_to_sync(layer.group_send)(run_group(run_id), available)
        async_to_sync(layer.group_send)(RUNS_GROUP, changed)

    transaction.on_commit(send)
