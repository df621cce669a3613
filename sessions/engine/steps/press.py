"""Press a key, in an element or on the page."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import field_validator

from sessions.engine.steps.base import Acting, StepBase, StepKind, StepRecord
from sessions.engine.steps.language import Target

KEY_NAME = re.compile(
    r"^((Control|Shift|Alt|Meta)\+)*"
    r"(Enter|Tab|Escape|Backspace|Delete|Space|Home|End|PageUp|PageDown|Insert|"
    r"ArrowUp|ArrowDown|ArrowLeft|ArrowRight|F([1-9]|1[0-2])|[A-Za-z0-9])$"
)


class PressStep(StepBase):
    type: Literal["press"]
    label: ClassVar[str] = "Press a key"
    editor_fields: ClassVar[tuple[str, ...]] = ("key", "target_optional")
    warns_on_final_words: ClassVar[bool] = True
    key: str
    target: Target | None = None

    @field_validator("key")
    @classmethod
    def _known_key(cls, key: str) -> str:
        if not KEY_NAME.match(key):
            raise ValueError(
                f"'{key}' is not a key name (examples: Enter, Tab, Escape, ArrowDown, Control+A)"
            )
        return key

    def sentence(self) -> str:
        where = f" in {self.target.describe()}" if self.target else ""
        return f"Press {self.key}{where}"


def act(runner: Acting, step: PressStep, record: StepRecord, timeout: float) -> None:
    if step.target is not None:
        runner.locate(runner.page, step.target).press(step.key, timeout=timeout)
    else:
        runner.page.keyboard.press(step.key)
    runner.settle(runner.page)


KIND = StepKind(PressStep, act)
