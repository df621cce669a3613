"""Sending to a channel-layer group from any thread: the dashboard's consumers and the worker's
live feed both send here."""

from __future__ import annotations

import asyncio
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer

# The in-memory channel layer (one process, the embedded default) is not thread-safe: a message
# put on a queue from another thread's loop does not wake the loop waiting on it. So each side
# says which loop receives a group's messages, and sends for that group run on that loop.
_receiving_loops: dict[str, asyncio.AbstractEventLoop] = {}
# How long a send waits for the receiving loop to run it; a running server's loop takes
# milliseconds.
HOP_SECONDS = 5.0


def receive_group_on_this_loop(group: str) -> None:
    _receiving_loops[group] = asyncio.get_running_loop()


async def layer_send(group: str, message: dict[str, Any], *, channel: str = "") -> None:
    """Send ``message`` to ``group`` (or to ``channel``, a member of it), thread-safely."""
    layer = get_channel_layer()
    if layer is None:
        return
    send = layer.send(channel, message) if channel else layer.group_send(group, message)
    loop = _receiving_loops.get(group) if isinstance(layer, InMemoryChannelLayer) else None
    # A loop that no longer runs (its server is stopping) would never run the send: the
    # message goes on this loop's side, where nobody waits for it, instead of hanging here.
    if loop is None or loop is asyncio.get_running_loop() or not loop.is_running():
        await send
        return
    sent = asyncio.run_coroutine_threadsafe(send, loop)
    try:
        # Bounded: a loop that stops meanwhile never runs the send.
        async with asyncio.timeout(HOP_SECONDS):
            await asyncio.wrap_future(sent)
    except TimeoutError:
        sent.cancel()


def stop_receiving_group_on_this_loop(group: str) -> None:
    if _receiving_loops.get(group) is asyncio.get_running_loop():
        _receiving_loops.pop(group, None)
