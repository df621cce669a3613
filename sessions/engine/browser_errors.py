"""Playwright's error classes, without its sync API.

``playwright.sync_api.Error`` and ``TimeoutError`` are these classes; importing them from there
loads the whole generated API (65 ms, 20 MB), which a web process must not pay to validate a
workflow with the step models that also say how a step acts.
``tests/sessions/test_step_kinds.py`` checks they are still the same classes.
"""

from __future__ import annotations

from playwright._impl._errors import Error as BrowserError
from playwright._impl._errors import TimeoutError as BrowserTimeout

__all__ = ["BrowserError", "BrowserTimeout"]
