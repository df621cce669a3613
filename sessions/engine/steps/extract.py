"""Read values off the page into the run's outputs: text, numbers, money, dates, attributes,
rows."""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from sessions.engine.steps.base import (
    Acting,
    Problem,
    StepBase,
    StepFailed,
    StepKind,
    StepRecord,
    StepScope,
)
from sessions.engine.steps.language import IDENTIFIER, Strict, Target

if TYPE_CHECKING:
    from playwright.sync_api import Page


class ExtractField(Strict):
    name: str = Field(pattern=IDENTIFIER)
    kind: Literal["text", "number", "money", "date", "attribute", "rows"]
    target: Target
    attribute: str | None = Field(default=None, pattern=r"^[a-zA-Z_:][\w:.-]*$")
    date_format: str | None = Field(default=None, max_length=50)
    columns: dict[Annotated[str, Field(pattern=IDENTIFIER)], Target] | None = None

    @model_validator(mode="after")
    def _options_fit_kind(self) -> ExtractField:
        if (self.kind == "attribute") != (self.attribute is not None):
            raise ValueError("'attribute' is required for kind attribute and only there")
        if (self.kind == "rows") != bool(self.columns):
            raise ValueError(
                "kind rows needs 'columns' (name → target inside each row), and only rows has them"
            )
        if self.date_format is not None and self.kind != "date":
            raise ValueError("'date_format' only applies to kind date")
        return self


class ExtractStep(StepBase):
    type: Literal["extract"]
    label: ClassVar[str] = "Extract values"
    touches_page: ClassVar[bool] = False
    in_session: ClassVar[bool] = False
    editor_fields: ClassVar[tuple[str, ...]] = ("fields_text",)
    fields: list[ExtractField] = Field(min_length=1, max_length=50)

    def targets(self) -> list[Target]:
        return [f.target for f in self.fields]

    def sentence(self) -> str:
        names = ", ".join(f"{f.name} ({f.kind})" for f in self.fields)
        return f"Extract {names}"

    def problems(self, here: tuple[str | int, ...], scope: StepScope) -> list[Problem]:
        problems = []
        for field_index, extract in enumerate(self.fields):
            if extract.name in scope.outputs:
                path = (*here, "fields", field_index, "name")
                problems.append(
                    Problem(path=path, message=f"output '{extract.name}' is extracted twice")
                )
            scope.outputs.add(extract.name)
        return problems


def act(runner: Acting, step: ExtractStep, record: StepRecord, timeout: float) -> None:
    for extract in step.fields:
        value = extract_field(runner, runner.page, extract, timeout)
        runner.outputs[extract.name] = value
        record.outputs[extract.name] = value


def extract_field(runner: Acting, page: Page, extract: ExtractField, timeout: float) -> Any:
    # A rows target matches every row: many matches are the point, not an ambiguity.
    element = runner.locate(page, extract.target, strict=extract.kind != "rows")
    if extract.kind == "rows":
        rows = []
        for row in element.all():
            rows.append(
                {
                    name: _clean(runner.locate(row, target).first.inner_text(timeout=timeout))
                    for name, target in (extract.columns or {}).items()
                }
            )
        return rows
    if extract.kind == "attribute":
        value = element.get_attribute(str(extract.attribute), timeout=timeout)
        if value is None:
            raise StepFailed(f"{extract.target.describe()} has no attribute '{extract.attribute}'")
        return value
    text = _clean(element.inner_text(timeout=timeout))
    if extract.kind == "text":
        return text
    if extract.kind in ("number", "money"):
        return str(_parse_number(text, extract.name))
    return _parse_date(text, extract.date_format, extract.name)


def _clean(text: str) -> str:
    return " ".join(text.split())


def _parse_number(text: str, name: str) -> Decimal:
    # "EUR 1,234.50", "1.234,50 €", "-12.00": keep the digits and the last decimal separator.
    digits = re.sub(r"[^\d,.\-]", "", text)
    if "," in digits and "." in digits:
        decimal_sep = "," if digits.rfind(",") > digits.rfind(".") else "."
        thousands = "." if decimal_sep == "," else ","
        digits = digits.replace(thousands, "").replace(decimal_sep, ".")
    elif "," in digits:
        head, _, tail = digits.rpartition(",")
        digits = f"{head.replace(',', '')}.{tail}" if len(tail) != 3 else digits.replace(",", "")
    try:
        return Decimal(digits)
    except InvalidOperation:
        raise StepFailed(f"'{text}' is not a number (extracting {name})") from None


def _parse_date(text: str, date_format: str | None, name: str) -> str:
    formats = (
        [date_format]
        if date_format
        else ["%Y-%m-%d", "%d %b %Y", "%d.%m.%Y", "%d/%m/%Y", "%b %d, %Y"]
    )
    for candidate in formats:
        try:
            return datetime.strptime(text, candidate).date().isoformat()
        except ValueError:
            continue
    raise StepFailed(f"'{text}' is not a date (extracting {name})")


KIND = StepKind(ExtractStep, act)
