"""Tick a checkbox."""

from __future__ import annotations

from typing import ClassVar, Literal

from sessions.engine.steps.base import Acting, StepBase, StepKind, StepRecord
from sessions.engine.steps.language import Target


class CheckStep(StepBase):
    type: Literal["check"]
    label: ClassVar[str] = "Tick"
    editor_fields: ClassVar[tuple[str, ...]] = ("target",)
    target: Target

    def sentence(self) -> str:
        return f"Tick {self.target.describe()}"


def act(runner: Acting, step: CheckStep, record: StepRecord, timeout: float) -> None:
    runner.locate(runner.page, step.target).check(timeout=timeout)


KIND = StepKind(CheckStep, act)
