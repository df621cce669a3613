from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.patching import patch_dispatch

# Runs are launched and executed by the tests themselves, with the sessions tests' fixtures.
from tests.sessions.conftest import acme_credential, demo_workflow, no_background_runs, operator

__all__ = ["acme_credential", "continuations", "demo_workflow", "no_background_runs", "operator"]


@pytest.fixture
def continuations(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The continuations decisions queue; none starts (a test runs one itself if it wants)."""
    sent: list[dict[str, Any]] = []
    lock = threading.Lock()  # decisions may come from several threads at once

    def record(task: Any, queue: str | None = None, **kwargs: Any) -> None:
        with lock:
            sent.append({"task": task.name, "queue": queue, **kwargs})

    patch_dispatch(monkeypatch, record)
    return sent
