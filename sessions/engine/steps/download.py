"""Click what starts a download and keep the file."""

from __future__ import annotations

from sessions.engine.steps.base import Acting, StepRecord
from workflows.schema import DownloadStep


def act(runner: Acting, step: DownloadStep, record: StepRecord, timeout: float) -> None:
    page = runner.page
    with page.expect_download(timeout=timeout) as download_info:
        runner.locate(page, step.target).click(timeout=timeout)
    artifact = runner.save_download(step.name, download_info.value)
    record.artifacts.append(artifact)
    runner.outputs[step.name] = artifact.filename
