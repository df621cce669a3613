"""Replacing ``pandaweb.core.dispatch.dispatch`` in a test, where it is used.

Services bind ``dispatch`` when they are imported (``from pandaweb.core.dispatch import
dispatch``), so patching the dispatcher's own module attribute reaches none of them. This patches
that attribute and every project module's binding of it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from pandaweb.core import dispatch as dispatcher

PROJECT_PACKAGES = ("pandaweb.", "workflows.", "sessions.", "approvals.")


def patch_dispatch(monkeypatch: pytest.MonkeyPatch, replacement: Callable[..., Any]) -> None:
    original = dispatcher.dispatch
    monkeypatch.setattr(dispatcher, "dispatch", replacement)
    for name, module in list(sys.modules.items()):
        if name.startswith(PROJECT_PACKAGES) and getattr(module, "dispatch", None) is original:
            monkeypatch.setattr(module, "dispatch", replacement)
