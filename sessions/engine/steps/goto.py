"""Go to an address: one the egress proxy refused, or that answered an error, fails the step."""

from __future__ import annotations

from playwright.sync_api import Error as PlaywrightError

from sessions.engine.outcomes import answer_words, proxy_answer
from sessions.engine.steps.base import Acting, StepFailed, StepRecord
from workflows.schema import GotoStep

# How Chromium reports a connection the egress proxy cut (plain HTTP, then a CONNECT tunnel).
_CONNECTION_CUT = (
    "ERR_CONNECTION_RESET",
    "ERR_EMPTY_RESPONSE",
    "ERR_TUNNEL_CONNECTION_FAILED",
    "ERR_PROXY_CONNECTION_FAILED",
)


def act(runner: Acting, step: GotoStep, record: StepRecord, timeout: float) -> None:
    page = runner.page
    url = runner.text(step.url)
    try:
        response = page.goto(url, wait_until="load", timeout=timeout)
    except PlaywrightError as exc:
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
