"""Click an element, then let a page it opens load."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from sessions.engine.steps.base import Acting, StepBase, StepKind, StepRecord
from sessions.engine.steps.language import Target


class ClickStep(StepBase):
    type: Literal["click"]
    label: ClassVar[str] = "Click"
    editor_fields: ClassVar[tuple[str, ...]] = ("target", "dialog", "prompt_text")
    warns_on_final_words: ClassVar[bool] = True
    target: Target
    # What to do with a confirm()/alert()/prompt() the click opens; a dialog the step does not
    # declare fails it (nobody says yes on the workflow's behalf).
    dialog: Literal["accept", "dismiss"] | None = None
    prompt_text: str | None = Field(default=None, max_length=500)

    @model_validator(mode="after")
    def _prompt_with_accept(self) -> ClickStep:
        if self.prompt_text is not None and self.dialog != "accept":
            raise ValueError(
                "'prompt_text' is typed into a prompt() it accepts: add dialog: accept"
            )
        return self

    def templates(self) -> list[tuple[str, str]]:
        return [("prompt_text", self.prompt_text)] if self.prompt_text is not None else []

    def sentence(self) -> str:
        if self.dialog is not None:
            return f"Click {self.target.describe()} and {self.dialog} the dialog it opens"
        return f"Click {self.target.describe()}"


def act(runner: Acting, step: ClickStep, record: StepRecord, timeout: float) -> None:
    runner.locate(runner.page, step.target).click(timeout=timeout)
    runner.settle(runner.page)


KIND = StepKind(ClickStep, act)
