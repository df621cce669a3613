"""Press a key, in an element or on the page."""

from __future__ import annotations

from sessions.engine.steps.base import Acting, StepRecord
from workflows.schema import PressStep


def act(runner: Acting, step: PressStep, record: StepRecord, timeout: float) -> None:
    if step.target is not None:
        runner.locate(runner.page, step.target).press(step.key, timeout=timeout)
    else:
        runner.page.keyboard.press(step.key)
    runner.settle(runner.page)
