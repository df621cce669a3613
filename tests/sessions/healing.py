"""What the healing tests share: a run that failed at a step, on a page they describe."""

from __future__ import annotations

import io
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone
from PIL import Image

from sessions import services
from sessions.models import Run, StepResult
from workflows.models import Workflow

# The indexes of two steps of the demo workflow (workflows/examples/acme-pay-invoice.yaml).
REVIEW, SUBMIT = 11, 13


def element(number: int, role: str, name: str) -> dict[str, Any]:
    box = {"x": 40.0 * number, "y": 100.0, "width": 120.0, "height": 30.0}
    return {"number": number, "role": role, "name": name, "box": box, "interactive": True}


def failed_at(
    operator: User,
    workflow: Workflow,
    index: int,
    step_id: str,
    names: list[str],
    role: str = "button",
) -> Run:
    """A run of ``workflow`` that failed at step ``index`` on a page with ``role`` elements
    named ``names``."""
    run = services.run_launch(
        workflow_id=workflow.pk,
        user=operator,
        raw_inputs={"invoice": "INV-1001", "amount": "12.00"},
    )
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.FAILED, failure_step=step_id, finished_at=timezone.now()
    )
    picture = io.BytesIO()
    Image.new("RGB", (1280, 720), "white").save(picture, format="JPEG")
    directory = services.run_files_dir(run.pk) / "steps"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "shot.jpg").write_bytes(picture.getvalue())
    StepResult.objects.create(
        run=run, index=index, step_id=step_id, step_type="click", sentence=step_id,
        status=StepResult.Status.FAILED, started_at=timezone.now(), duration_ms=10_000,
        error="no button named 'Review payment' on http://127.0.0.1:8001/pay",
        screenshot="steps/shot.jpg",
        observation={"elements": [element(i + 1, role, n) for i, n in enumerate(names)]},
    )  # fmt: skip
    return run
