"""Replacing a function in a test, where it is used.

Modules bind what they import (``from pandaweb.core.dispatch import dispatch``), so patching the
defining module's attribute reaches none of them. ``patch_where_used`` patches that attribute and
every project module's binding of the same object.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from pandaweb.core import dispatch as dispatcher
from sessions.services import runstate

PROJECT_PACKAGES = ("pandaweb.", "workflows.", "sessions.", "approvals.")


def patch_where_used(
    monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str, replacement: Any
) -> None:
    original = getattr(module, name)
    monkeypatch.setattr(module, name, replacement)
    for imported, other in list(sys.modules.items()):
        if imported.startswith(PROJECT_PACKAGES) and getattr(other, name, None) is original:
            monkeypatch.setattr(other, name, replacement)


def patch_dispatch(monkeypatch: pytest.MonkeyPatch, replacement: Callable[..., Any]) -> None:
    patch_where_used(monkeypatch, dispatcher, "dispatch", replacement)


def patch_destroy_sandbox(monkeypatch: pytest.MonkeyPatch, replacement: Callable[..., Any]) -> None:
    patch_where_used(monkeypatch, runstate, "destroy_sandbox", replacement)
