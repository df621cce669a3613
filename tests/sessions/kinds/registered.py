"""Run in a process of its own by ``test_step_kinds.py``: register the hover kind at start-up,
then use it everywhere a kind is used, and print what each place made of it as JSON."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import django

from sessions.engine import steps
from tests.sessions.kinds import hover

steps.register(hover.KIND)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pandaweb.settings")
django.setup()

from sessions.engine.plan import RunPlan  # noqa: E402
from sessions.engine.runner import Runner  # noqa: E402
from sessions.engine.steps.language import Target  # noqa: E402
from workflows.fileformat import dump_document, load_document  # noqa: E402
from workflows.forms import StepForm  # noqa: E402
from workflows.schema import STEP_TYPES, describe_step, document_problems  # noqa: E402
from workflows.views import STEP_PALETTE  # noqa: E402


class Kept:
    def __init__(self) -> None:
        self.records: list[Any] = []

    def step_finished(self, record: Any) -> None:
        self.records.append(record)

    def action_starting(self, index: int) -> None: ...
    def action_finished(self, index: int, result: str = "") -> None: ...
    def action_refused(self, index: int, reason: str) -> None: ...

    def stop_reason(self) -> str | None:
        return None


def main(cdp_url: str, portal: str, artifacts: str) -> dict[str, Any]:
    text = f"""pandaweb: 1
name: Hover
slug: hover
steps:
  - {{id: open, type: goto, url: "{portal}/login"}}
  - {{id: point, type: hover, target: {{role: button, name: Sign in}}}}
settings:
  allowed_hosts: ["{portal.removeprefix("http://")}"]
"""
    document = load_document(text)
    form = StepForm(
        data={"id": "point", "target": 'button "Sign in"', "timeout_ms": 10_000},
        step_type="hover",
    )
    assert form.is_valid(), form.errors
    broken = document.model_copy(
        update={"steps": [*document.steps[:1], hover.HoverStep(id="p", type="hover",
                                                              target=Target(css="#x"))]}
    )  # fmt: skip
    plan = RunPlan(
        steps=[step.model_dump(exclude_defaults=True) for step in document.steps],
        inputs={},
        secrets={},
        step_budget=5,
        deadline=time.time() + 60,
        artifacts_dir=Path(artifacts),
    )
    kept = Kept()
    outcome = Runner(plan, kept).run(cdp_url)
    return {
        "kinds": list(STEP_TYPES),
        "palette": dict(STEP_PALETTE).get("hover"),
        "sentence": describe_step(document.steps[1]),
        "dumped": "type: hover" in dump_document(document),
        "problems": [p.message for p in document_problems(document)],
        "broken": [p.message for p in document_problems(broken)],
        "form": form.to_data(),
        "outcome": outcome.status,
        "recorded": [(r.step_type, r.sentence, r.status, r.outputs) for r in kept.records],
    }


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])))
