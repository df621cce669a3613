"""Save a picture of the page as a file of the run (secret fields masked)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from sessions.engine.steps.base import Acting, Problem, StepBase, StepKind, StepRecord, StepScope
from sessions.engine.steps.language import IDENTIFIER


class ScreenshotStep(StepBase):
    type: Literal["screenshot"]
    label: ClassVar[str] = "Screenshot"
    touches_page: ClassVar[bool] = False
    in_session: ClassVar[bool] = False
    editor_fields: ClassVar[tuple[str, ...]] = ("name", "full_page")
    name: str = Field(pattern=IDENTIFIER)
    full_page: bool = False

    def sentence(self) -> str:
        return f"Take a screenshot '{self.name}'"

    def problems(self, here: tuple[str | int, ...], scope: StepScope) -> list[Problem]:
        return scope.declare_output(self.name, (*here, "name"))


def act(runner: Acting, step: ScreenshotStep, record: StepRecord, timeout: float) -> None:
    page = runner.page
    png = page.screenshot(
        type="png",
        full_page=step.full_page,
        mask=runner.masks(page) or None,
        timeout=timeout,
    )
    record.artifacts.append(runner.save_file(step.name, f"{step.name}.png", png))
    runner.outputs[step.name] = f"{step.name}.png"


KIND = StepKind(ScreenshotStep, act)
