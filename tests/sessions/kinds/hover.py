"""A step kind that is not pandaweb's, written as a plugin would: its module and one
``register`` call (``tests/sessions/test_step_kinds.py`` proves that is all a kind needs)."""

from __future__ import annotations

from typing import ClassVar, Literal

from sessions.engine.steps.base import Acting, Problem, StepBase, StepKind, StepRecord, StepScope
from sessions.engine.steps.language import Target


class HoverStep(StepBase):
    type: Literal["hover"]
    label: ClassVar[str] = "Hover over"
    editor_fields: ClassVar[tuple[str, ...]] = ("target",)
    target: Target

    def sentence(self) -> str:
        return f"Hover over {self.target.describe()}"

    def problems(self, here: tuple[str | int, ...], scope: StepScope) -> list[Problem]:
        if self.target.css is not None:
            return [Problem(path=(*here, "target"), message="hover over what people see, not CSS")]
        return []


def act(runner: Acting, step: HoverStep, record: StepRecord, timeout: float) -> None:
    element = runner.locate(runner.page, step.target)
    element.hover(timeout=timeout)
    # What the page itself says, so the test sees the pointer really is there.
    record.outputs["hovered"] = element.evaluate("e => e.matches(':hover')")


KIND = StepKind(HoverStep, act)
