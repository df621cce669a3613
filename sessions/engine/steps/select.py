"""Choose an option in a select or a custom dropdown."""

from __future__ import annotations

from sessions.engine.steps.base import Acting, StepRecord
from workflows.schema import SelectStep


def act(runner: Acting, step: SelectStep, record: StepRecord, timeout: float) -> None:
    runner.choose(runner.page, step, timeout)
