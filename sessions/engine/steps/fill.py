"""Type a value into a field; what was typed (a secret masked) goes into the approval's evidence."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from sessions.engine.steps.base import Acting, StepBase, StepKind, StepRecord
from sessions.engine.steps.language import TEMPLATE, Target, references
from sessions.engine.vocabulary import MASK, PUBLIC_CREDENTIAL_FIELDS


class FillStep(StepBase):
    type: Literal["fill"]
    label: ClassVar[str] = "Fill a field"
    editor_fields: ClassVar[tuple[str, ...]] = ("target", "value")
    secret_fields: ClassVar[tuple[str, ...]] = ("value",)
    target: Target
    value: str = Field(max_length=5000)

    def templates(self) -> list[tuple[str, str]]:
        return [("value", self.value)]

    def sentence(self) -> str:
        return f"Fill {self.target.describe()} with {_fill_value(self.value)}"


def _fill_value(value: str) -> str:
    if "secrets." not in value:
        return f"'{value}'"
    try:
        refs = references(value)
    except ValueError:
        return "a secret"
    # A username is no secret: the sentence may say whose it is (the value shows once typed).
    whole = TEMPLATE.fullmatch(value.strip()) is not None
    if whole and len(refs) == 1 and refs[0][0] == "secrets" and refs[0][2] == "username":
        return f"the username of credential '{refs[0][1]}'"
    return "a secret"


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


KIND = StepKind(FillStep, act)
