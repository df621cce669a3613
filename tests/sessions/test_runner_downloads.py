"""A download the runner cannot read (the browser saved it inside a microVM) fails the step in
plain words instead of with Playwright's file-copy error."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Error as PlaywrightError

from sessions.engine.plan import RunPlan
from sessions.engine.runner import Runner
from sessions.engine.steps.base import StepFailed


class GuestDownload:
    """Stands in for a Playwright download whose file is in a VM: what save_as then raises."""

    suggested_filename = "INV-1040.csv"

    def save_as(self, path: Path) -> None:
        raise PlaywrightError(
            "Download.save_as: ENOENT: no such file or directory, copyfile "
            f"'/tmp/playwright-artifacts-x/guid' -> '{path}'"
        )


class BrokenDownload(GuestDownload):
    def save_as(self, path: Path) -> None:
        raise PlaywrightError("Download.save_as: Target page, context or browser has been closed")


def runner(tmp_path: Path) -> Runner:
    plan = RunPlan(
        steps=[],
        inputs={},
        secrets={},
        step_budget=1,
        deadline=time.time() + 60,
        artifacts_dir=tmp_path,
    )
    return Runner(plan, sink=Any)  # type: ignore[arg-type]


def test_a_download_left_in_the_guest_fails_the_step_in_plain_words(tmp_path: Path) -> None:
    with pytest.raises(StepFailed, match="keeps downloads inside the VM"):
        runner(tmp_path).save_download("invoice_csv", GuestDownload())  # type: ignore[arg-type]


def test_other_download_errors_stay_what_they_are(tmp_path: Path) -> None:
    with pytest.raises(PlaywrightError, match="has been closed"):
        runner(tmp_path).save_download("invoice_csv", BrokenDownload())  # type: ignore[arg-type]
