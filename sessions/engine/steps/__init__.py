"""One module per step kind: what the step does on the page, and the registry that maps the
schema's step classes to it. A new kind is its module here and one line in ``ACTIONS``.

An ``ask`` step does nothing on the page (the runner pauses the run for its answer), so it has no
module here.
"""

from __future__ import annotations

from sessions.engine.steps import (
    assertion,
    check,
    click,
    download,
    extract,
    fill,
    goto,
    login,
    press,
    screenshot,
    select,
    uncheck,
    wait,
    wait_for,
)
from sessions.engine.steps.base import Act
from workflows.schema import (
    AssertStep,
    CheckStep,
    ClickStep,
    DownloadStep,
    ExtractStep,
    FillStep,
    GotoStep,
    LoginStep,
    PressStep,
    ScreenshotStep,
    SelectStep,
    StepBase,
    UncheckStep,
    WaitForStep,
    WaitStep,
)

ACTIONS: dict[type[StepBase], Act] = {
    GotoStep: goto.act,
    ClickStep: click.act,
    FillStep: fill.act,
    SelectStep: select.act,
    CheckStep: check.act,
    UncheckStep: uncheck.act,
    PressStep: press.act,
    WaitForStep: wait_for.act,
    WaitStep: wait.act,
    ExtractStep: extract.act,
    AssertStep: assertion.act,
    ScreenshotStep: screenshot.act,
    DownloadStep: download.act,
    LoginStep: login.act,
}
