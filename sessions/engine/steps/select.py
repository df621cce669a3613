"""Choose an option in a select or a custom dropdown."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from sessions.engine.steps.base import Acting, StepBase, StepFailed, StepKind, StepRecord
from sessions.engine.steps.language import Target


class SelectStep(StepBase):
    type: Literal["select"]
    label: ClassVar[str] = "Choose an option"
    editor_fields: ClassVar[tuple[str, ...]] = ("target", "option")
    target: Target
    option: str = Field(min_length=1, max_length=300)

    def templates(self) -> list[tuple[str, str]]:
        return [("option", self.option)]

    def sentence(self) -> str:
        return f"Choose '{self.option}' in {self.target.describe()}"


def act(runner: Acting, step: SelectStep, record: StepRecord, timeout: float) -> None:
    page = runner.page
    element = runner.locate(page, step.target)
    option = runner.text(step.option)
    tag = element.evaluate("e => e.tagName", timeout=timeout)
    if str(tag).lower() == "select":
        element.select_option(label=option, timeout=timeout)
        return
    # A custom dropdown: open it, then choose the option by its accessible name.
    element.click(timeout=timeout)
    choice = page.get_by_role("option", name=option, exact=True)
    if choice.count() == 0:
        raise StepFailed(f"the dropdown {step.target.describe()} has no option '{option}'")
    choice.first.click(timeout=timeout)


KIND = StepKind(SelectStep, act)
