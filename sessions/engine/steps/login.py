"""Log in with a credential typed by code, never shown."""

from __future__ import annotations

from sessions.engine.steps.base import Acting, StepFailed, StepRecord
from workflows.schema import LoginStep


def act(runner: Acting, step: LoginStep, record: StepRecord, timeout: float) -> None:
    page = runner.page
    fields = runner.plan.secrets.get(step.credential)
    if not fields or "username" not in fields or "password" not in fields:
        raise StepFailed(f"credential '{step.credential}' is not available to this run")
    runner.locate(page, step.username).fill(fields["username"], timeout=timeout)
    runner.locate(page, step.password).fill(fields["password"], timeout=timeout)
    runner.locate(page, step.submit).click(timeout=timeout)
    runner.settle(page)
