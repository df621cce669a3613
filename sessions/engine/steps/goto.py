"""Go to an address: one the egress proxy refused, or that answered an error, fails the step."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from sessions.engine.answers import answer_words, proxy_answer
from sessions.engine.browser_errors import BrowserError
from sessions.engine.steps.base import (
    Acting,
    Problem,
    StepBase,
    StepFailed,
    StepKind,
    StepRecord,
    StepScope,
    url_problem,
)

# How Chromium reports a connection the egress proxy cut (plain HTTP, then a CONNECT tunnel).
_CONNECTION_CUT = (
    "ERR_CONNECTION_RESET",
    "ERR_EMPTY_RESPONSE",
    "ERR_TUNNEL_CONNECTION_FAILED",
    "ERR_PROXY_CONNECTION_FAILED",
)


class GotoStep(StepBase):
    type: Literal["goto"]
    label: ClassVar[str] = "Go to a page"
    editor_fields: ClassVar[tuple[str, ...]] = ("url",)
    url: str = Field(min_length=1, max_length=2000)

    def templates(self) -> list[tuple[str, str]]:
        return [("url", self.url)]

    def sentence(self) -> str:
        return f"Go to {self.url}"

    def problems(self, here: tuple[str | int, ...], scope: StepScope) -> list[Problem]:
        problem = url_problem(self.url, scope.hosts)
        return [Problem(path=(*here, "url"), message=problem)] if problem else []


def act(runner: Acting, step: GotoStep, record: StepRecord, timeout: float) -> None:
    page = runner.page
    url = runner.text(step.url)
    try:
        response = page.goto(url, wait_until="load", timeout=timeout)
    except BrowserError as exc:
        if any(code in str(exc) for code in _CONNECTION_CUT):
            # The egress proxy cuts refused connections like a network failure, so the
            # page cannot tell; the run's refusals list says which host and why.
            raise StepFailed(
                f"{url} could not be reached: the connection was cut (a host outside the "
                "workflow's allowed hosts is refused; the run page lists each refusal)"
            ) from None
        raise
    if response is not None and proxy_answer(response):
        words = answer_words(response)
        raise StepFailed(
            f"{url} could not be reached: the egress proxy answered HTTP "
            f"{response.status}" + (f": {words}" if words else "")
        )
    if response is not None and response.status >= 400:
        raise StepFailed(f"{page.url} answered HTTP {response.status}")


KIND = StepKind(GotoStep, act)
