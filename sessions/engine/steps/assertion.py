"""Check the outcome on the page; every failing check is said."""

from __future__ import annotations

from sessions.engine.steps.base import Acting, StepFailed, StepRecord
from workflows.schema import AssertStep


def act(runner: Acting, step: AssertStep, record: StepRecord, timeout: float) -> None:
    failures = [f for f in (runner.check_outcome(runner.page, c) for c in step.checks) if f]
    if failures:
        raise StepFailed("; ".join(failures))
