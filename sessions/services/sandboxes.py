"""The installation's sandbox backends, and whether a run's recorded sandbox can still serve it
(its egress supervisor and its browser)."""

from __future__ import annotations

import os
import socket
from typing import Any

from django.conf import settings

from sessions.engine.sandbox.backends import get_backend
from sessions.engine.sandbox.base import Sandbox, SandboxBackend, SandboxError
from sessions.engine.sandbox.egress import Egress


def sandbox_backend(name: str) -> SandboxBackend:
    """The backend ``name``, configured by ``settings.ENGINE_CONFIG``: the one way the run core
    gets a backend, so every process of a host finds the same sandboxes. Raises
    ``SandboxError`` for a name no backend has."""
    return get_backend(name, settings.ENGINE_CONFIG)


def sandbox_alive(record: dict[str, Any], *, quick: bool = False) -> str:
    """Why a recorded sandbox can no longer serve its run ('' when it can).

    ``quick`` (on a continuation's path, where every millisecond is the reviewer's wait): the
    supervisor's pid and a signal-0 to the browser's process group, no scan of the host's
    processes; a browser that died anyway fails the run when the runner cannot reconnect.
    """
    if record.get("egress_dir") and not Egress(record["egress_dir"]).alive():
        return "its egress proxy stopped"
    if quick:
        pgid = record.get("pgid")
        if record.get("host") == socket.gethostname() and isinstance(pgid, int) and pgid > 0:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return "its browser stopped"
            except PermissionError:
                return "its browser's process group belongs to someone else"
        return ""
    try:
        sandbox = Sandbox.from_dict(record)
        if not sandbox_backend(sandbox.backend).alive(sandbox):
            return "its browser stopped"
    except SandboxError as exc:
        return str(exc)
    except Exception as exc:  # a remote backend that cannot be asked counts as gone
        return f"its browser cannot be reached ({exc})"
    return ""
