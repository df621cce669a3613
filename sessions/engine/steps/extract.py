"""Read values off the page into the run's outputs."""

from __future__ import annotations

from sessions.engine.steps.base import Acting, StepRecord
from workflows.schema import ExtractStep


def act(runner: Acting, step: ExtractStep, record: StepRecord, timeout: float) -> None:
    for extract in step.fields:
        value = runner.extract_field(runner.page, extract, timeout)
        runner.outputs[extract.name] = value
        record.outputs[extract.name] = value
