"""Untick a checkbox."""

from __future__ import annotations

from typing import ClassVar, Literal

from sessions.engine.steps.base import Acting, StepBase, StepKind, StepRecord
from sessions.engine.steps.language import Target


class UncheckStep(StepBase):
    type: Literal["uncheck"]
    label: ClassVar[str] = "Untick"
    editor_fields: ClassVar[tuple[str, ...]] = ("target",)
    target: Target

    def sentence(self) -> str:
        return f"Untick {self.target.describe()}"


def act(runner: Acting, step: UncheckStep, record: StepRecord, timeout: float) -> None:
    runner.locate(runner.page, step.target).uncheck(timeout=timeout)


KIND = StepKind(UncheckStep, act)
