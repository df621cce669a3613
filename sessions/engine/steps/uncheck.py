"""Untick a checkbox."""

from __future__ import annotations

from sessions.engine.steps.base import Acting, StepRecord
from workflows.schema import UncheckStep


def act(runner: Acting, step: UncheckStep, record: StepRecord, timeout: float) -> None:
    runner.locate(runner.page, step.target).uncheck(timeout=timeout)
