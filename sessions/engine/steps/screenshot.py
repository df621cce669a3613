"""Save a picture of the page as a file of the run (secret fields masked)."""

from __future__ import annotations

from sessions.engine.steps.base import Acting, StepRecord
from workflows.schema import ScreenshotStep


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
