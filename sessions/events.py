"""Messages about runs on the channel layer. Every message is a RunEvent row first; the channel
message only says "run N has events up to seq S", and consumers read the rows, so a message that
is lost, late or doubled never loses or repeats anything on screen."""

from __future__ import annotations

from typing import Literal, TypedDict

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from sessions.layer import layer_send

RUNS_GROUP = "runs.all"


def run_group(run_id: int) -> str:
    return f"runs.{run_id}"


def queue_group(workflow_id: int) -> str:
    return f"queue.{workflow_id}"


def run_live_group(run_id: int) -> str:
    """The run's viewers: live frames and the control state go here."""
    return f"runs.{run_id}.live"


def run_feed_group(run_id: int) -> str:
    """The worker holding the run's browser: viewers' presence and input go here."""
    return f"runs.{run_id}.feed"


class RunEventsAvailable(TypedDict):
    type: Literal["run.events"]
    run_id: int
    seq: int


class RunChanged(TypedDict):
    type: Literal["runs.changed"]
    run_id: int


class QueueChanged(TypedDict):
    type: Literal["queue.changed"]
    workflow_id: int


def publish_queue_changed(workflow_id: int) -> None:
    """After commit: a workflow's queue moved (a run joined, left or was dispatched), so the
    pages of its waiting runs re-read their place."""
    changed: QueueChanged = {"type": "queue.changed", "workflow_id": workflow_id}

    def send() -> None:
        layer = get_channel_layer()
        if layer is not None:
            async_to_sync(layer.group_send)(queue_group(workflow_id), changed)

    transaction.on_commit(send)


def publish_run_events(run_id: int, seq: int) -> None:
    """After commit: tell the run's viewers and the runs list that new events exist."""
    available: RunEventsAvailable = {"type": "run.events", "run_id": run_id, "seq": seq}
    changed: RunChanged = {"type": "runs.changed", "run_id": run_id}

    def send() -> None:
        # On the loop that receives a group where one says so: the event streams' listener
        # (pandaweb.api.events_stream) on the embedded default, whose writers are other threads.
        async_to_sync(layer_send)(run_group(run_id), dict(available))
        async_to_sync(layer_send)(RUNS_GROUP, dict(changed))

    transaction.on_commit(send)


# The live view. Frames are the one exception to "URLs, never bytes": they are ephemeral (no row
# to replay, nothing to reconnect to), at most a few a second, and a file per frame would cost
# more than the frame. Secret fields are masked before a frame is sent.


class LiveFrame(TypedDict):
    type: Literal["live.frame"]
    jpeg: bytes
    width: int
    height: int
    device_width: float
    device_height: float
    captured_at: float
    masks: int


class LiveStep(TypedDict):
    type: Literal["live.step"]
    index: int


class LiveControl(TypedDict):
    """The control state, for every viewer: who has control (or asked for it), or nobody."""

    type: Literal["live.control"]
    state: Literal["none", "pending", "active"]
    user_id: int | None
    username: str
    note: str
    # While a person has control: seconds until the run's time limit, which ends the control.
    seconds_left: int | None


class LiveDialog(TypedDict):
    """A dialog the page opened while a person has control (``kind`` empty: none any more)."""

    type: Literal["live.dialog"]
    kind: Literal["", "alert", "confirm", "prompt", "beforeunload"]
    message: str
    default_prompt: str


class LiveWatching(TypedDict):
    """A viewer says it is there (on connect and every few seconds), or gone."""

    type: Literal["live.watching"]
    channel: str
    user_id: int
    present: bool


class LiveRequest(TypedDict):
    """A viewer with the right asks for control, hands it back, or sends one input."""

    type: Literal["live.request"]
    channel: str
    user_id: int
    username: str
    action: Literal["take", "release", "input"]
    input: dict[str, object]


class LiveRefused(TypedDict):
    type: Literal["live.refused"]
    reason: str
