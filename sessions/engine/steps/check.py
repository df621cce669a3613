"""Tick a checkbox."""

from __future__ import annotations

from sessions.engine.steps.base import Acting, StepRecord
from workflows.schema import CheckStep


def act(runner: Acting, step: CheckStep, record: StepRecord, timeout: float) -> None:
    runner.locate(runner.page, step.target).check(timeout=timeout)
