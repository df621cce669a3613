"""Click what starts a download and keep the file."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from sessions.engine.steps.base import Acting, Problem, StepBase, StepKind, StepRecord, StepScope
from sessions.engine.steps.language import IDENTIFIER, Target


class DownloadStep(StepBase):
    type: Literal["download"]
    label: ClassVar[str] = "Download a file"
    in_session: ClassVar[bool] = False
    editor_fields: ClassVar[tuple[str, ...]] = ("target", "name")
    target: Target
    name: str = Field(pattern=IDENTIFIER)

    def sentence(self) -> str:
        return f"Download '{self.name}' by clicking {self.target.describe()}"

    def problems(self, here: tuple[str | int, ...], scope: StepScope) -> list[Problem]:
        return scope.declare_output(self.name, (*here, "name"))


def act(runner: Acting, step: DownloadStep, record: StepRecord, timeout: float) -> None:
    page = runner.page
    with page.expect_download(timeout=timeout) as download_info:
        runner.locate(page, step.target).click(timeout=timeout)
    artifact = runner.save_download(step.name, download_info.value)
    record.artifacts.append(artifact)
    runner.outputs[step.name] = artifact.filename


KIND = StepKind(DownloadStep, act)
