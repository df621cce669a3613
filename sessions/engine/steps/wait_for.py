"""Wait for an element, an address, a text or an idle network; a refusal ends the wait."""

from __future__ import annotations

from sessions.engine.steps.base import Acting, StepRecord
from workflows.schema import WaitForStep


def act(runner: Acting, step: WaitForStep, record: StepRecord, timeout: float) -> None:
    runner.wait_for(runner.page, step, timeout)
