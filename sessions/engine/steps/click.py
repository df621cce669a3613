"""Click an element, then let a page it opens load."""

from __future__ import annotations

from sessions.engine.steps.base import Acting, StepRecord
from workflows.schema import ClickStep


def act(runner: Acting, step: ClickStep, record: StepRecord, timeout: float) -> None:
    runner.locate(runner.page, step.target).click(timeout=timeout)
    runner.settle(runner.page)
