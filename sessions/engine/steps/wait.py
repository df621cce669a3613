"""Pause, in real seconds, never past the run's time limit."""

from __future__ import annotations

import time

from sessions.engine.steps.base import Acting, StepRecord
from workflows.schema import WaitStep


def act(runner: Acting, step: WaitStep, record: StepRecord, timeout: float) -> None:
    # Real seconds, not scaled: the pause is for the portal, whose clock is not emulated.
    # Never past the run's time limit; the loop then reports the expiry.
    remaining_ms = (runner.plan.deadline - time.time()) * 1000
    runner.page.wait_for_timeout(max(0.0, min(step.seconds * 1000, remaining_ms)))
