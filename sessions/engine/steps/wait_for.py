"""Wait for an element, an address, a text or an idle network; a refusal ends the wait."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, model_validator

from sessions.engine.browser_errors import BrowserError, BrowserTimeout
from sessions.engine.steps.base import Acting, Refused, StepBase, StepFailed, StepKind, StepRecord
from sessions.engine.steps.language import Target, url_matches

if TYPE_CHECKING:
    from playwright.sync_api import Page


class WaitForStep(StepBase):
    type: Literal["wait_for"]
    label: ClassVar[str] = "Wait for"
    touches_page: ClassVar[bool] = False
    editor_fields: ClassVar[tuple[str, ...]] = ("condition", "target_optional", "url", "text")
    target: Target | None = None
    state: Literal["visible", "hidden"] = "visible"
    url: str | None = Field(default=None, min_length=1, max_length=2000)
    text: str | None = Field(default=None, min_length=1, max_length=500)
    network_idle: bool = False

    @model_validator(mode="after")
    def _one_condition(self) -> WaitForStep:
        given = [
            name
            for name, present in (
                ("target", self.target is not None),
                ("url", self.url is not None),
                ("text", self.text is not None),
                ("network_idle", self.network_idle),
            )
            if present
        ]
        if len(given) != 1:
            raise ValueError(
                "wait for exactly one of: target (with state), url, text, network_idle"
            )
        return self

    def templates(self) -> list[tuple[str, str]]:
        return [(name, value) for name, value in (("url", self.url), ("text", self.text)) if value]

    def sentence(self) -> str:
        if self.target is not None:
            return f"Wait until {self.target.describe()} is {self.state}"
        if self.url is not None:
            return f"Wait until the address matches {self.url}"
        if self.text is not None:
            return f"Wait until the page shows '{self.text}'"
        return "Wait until the network is idle"


def act(runner: Acting, step: WaitForStep, record: StepRecord, timeout: float) -> None:
    page = runner.page
    if step.network_idle:
        page.wait_for_load_state("networkidle", timeout=timeout)
        return
    # Polled rather than left to Playwright, so that a refusal the portal shows meanwhile
    # ends the wait in its words (and a waited-for text never matches inside it).
    clock = time.monotonic()
    while True:
        new = runner.new_refusals()
        if new:
            raise Refused("; ".join(new))
        if _waited(runner, page, step):
            return
        if (time.monotonic() - clock) * 1000 >= timeout:
            break
        page.wait_for_timeout(100)
    if step.target is not None:
        raise BrowserTimeout(f"waiting for {step.target.describe()} to be {step.state}: timed out")
    if step.url is not None:
        pattern = runner.text(step.url)
        raise StepFailed(f"the address did not come to match {pattern} (it is {page.url})")
    raise StepFailed(f"the page did not show '{runner.text(str(step.text))}' on {page.url}")


def _waited(runner: Acting, page: Page, step: WaitForStep) -> bool:
    try:
        if step.target is not None:
            visible = runner.locate(page, step.target).first.is_visible()
            return visible == (step.state == "visible")
        if step.url is not None:
            return url_matches(page.url, runner.text(step.url))
        return page.get_by_text(runner.text(str(step.text))).first.is_visible()
    except BrowserTimeout:
        return False
    except BrowserError as exc:
        if "context was destroyed" in str(exc) or "navigat" in str(exc):
            return False  # between two documents: look again
        raise


KIND = StepKind(WaitForStep, act)
