"""Pause, in real seconds, never past the run's time limit."""

from __future__ import annotations

import time
from typing import ClassVar, Literal

from pydantic import field_validator

from sessions.engine.steps.base import Acting, StepBase, StepKind, StepRecord

# A fixed pause is for portals that need time nothing on the page shows (a rate limit, a
# back-end job); anything longer than this should wait for what the page shows instead.
WAIT_LIMIT_SECONDS = 60


class WaitStep(StepBase):
    type: Literal["wait"]
    label: ClassVar[str] = "Pause"
    touches_page: ClassVar[bool] = False
    editor_fields: ClassVar[tuple[str, ...]] = ("seconds",)
    seconds: float

    @field_validator("seconds")
    @classmethod
    def _bounded(cls, seconds: float) -> float:
        if not 0 < seconds <= WAIT_LIMIT_SECONDS:
            raise ValueError(
                f"a wait lasts more than 0 and at most {WAIT_LIMIT_SECONDS} seconds (got "
                f"{seconds:g}); to wait longer, wait_for what the page shows when it is ready"
            )
        return seconds

    def sentence(self) -> str:
        return f"Wait {self.seconds:g} second{'' if self.seconds == 1 else 's'}"


def act(runner: Acting, step: WaitStep, record: StepRecord, timeout: float) -> None:
    # Real seconds, not scaled: the pause is for the portal, whose clock is not emulated.
    # Never past the run's time limit; the loop then reports the expiry.
    remaining_ms = (runner.plan.deadline - time.time()) * 1000
    runner.page.wait_for_timeout(max(0.0, min(step.seconds * 1000, remaining_ms)))


KIND = StepKind(WaitStep, act)
