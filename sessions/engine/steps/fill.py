"""Type a value into a field; what was typed (a secret masked) goes into the approval's evidence."""

from __future__ import annotations

from sessions.engine.steps.base import Acting, StepRecord
from sessions.engine.vocabulary import MASK, PUBLIC_CREDENTIAL_FIELDS
from workflows.schema import FillStep, references


def act(runner: Acting, step: FillStep, record: StepRecord, timeout: float) -> None:
    page = runner.page
    value = runner.text(step.value, secrets=True)
    runner.locate(page, step.target).fill(value, timeout=timeout)
    secret = any(
        (ns == "secrets" and sub not in PUBLIC_CREDENTIAL_FIELDS)
        or (ns == "outputs" and name in runner.code_names)
        for ns, name, sub in references(step.value)
    )
    runner.filled.append(
        {
            "step_id": step.id,
            "field": runner.words(step.target.describe()),
            "target": step.target.model_dump(exclude_defaults=True),
            "url": page.url,
            "value": MASK if secret else value,
            "secret": secret,
        }
    )
