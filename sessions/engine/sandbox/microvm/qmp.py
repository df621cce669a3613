"""Talking to one QEMU over its QMP socket, synchronously (no Django imports).

``qemu.qmp`` is asyncio-only and its legacy synchronous wrapper needs an event loop bound to the
calling thread, which Celery's thread pool does not have; each call here runs its own short loop.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from qemu.qmp import QMPClient, QMPError


class MonitorError(Exception):
    """QEMU refused a command, or its monitor could not be reached."""


def execute(socket_path: Path, command: str, arguments: dict[str, Any] | None = None) -> Any:
    """Run one QMP command and return its result."""
    return asyncio.run(_execute(socket_path, command, arguments))


def save_state(socket_path: Path, destination: Path, *, timeout: float) -> float:
    """Pause the VM and write its whole state (RAM included) to ``destination``.

    Returns the seconds it took. The VM stays paused: its caller stops QEMU afterwards, because
    a run must never go on in a browser whose state is now also a template for others.
    """
    return asyncio.run(_save_state(socket_path, destination, timeout))


async def _connect(socket_path: Path) -> QMPClient:
    client = QMPClient("pandaweb")
    try:
        await client.connect(str(socket_path))
    except (OSError, QMPError) as exc:
        raise MonitorError(f"QEMU's monitor at {socket_path} did not answer: {exc}") from exc
    return client


async def _execute(socket_path: Path, command: str, arguments: dict[str, Any] | None) -> Any:
    client = await _connect(socket_path)
    try:
        return await client.execute(command, arguments)
    except QMPError as exc:
        raise MonitorError(f"QEMU refused {command}: {exc}") from exc
    finally:
        await client.disconnect()


async def _save_state(socket_path: Path, destination: Path, timeout: float) -> float:
    client = await _connect(socket_path)
    started = time.monotonic()
    try:
        await client.execute("stop")
        # "exec:" hands the stream to a shell command; the path is ours and quoted for it.
        await client.execute("migrate", {"uri": f"exec:cat > '{destination}'"})
        while True:
            reply = await client.execute("query-migrate")
            status: dict[str, Any] = reply if isinstance(reply, dict) else {}
            state = status.get("status")
            if state == "completed":
                return time.monotonic() - started
            if state in {"failed", "cancelled"}:
                raise MonitorError(
                    f"saving the VM state {state}: {status.get('error-desc', 'no reason given')}"
                )
            if time.monotonic() - started > timeout:
                await client.execute("migrate_cancel")
                raise MonitorError(f"saving the VM state took longer than {timeout:g} s")
            await asyncio.sleep(0.05)
    except QMPError as exc:
        raise MonitorError(f"QEMU refused to save its state: {exc}") from exc
    finally:
        await client.disconnect()
