"""One-line forms of extract fields and assert checks for the editor (no Django imports).

The file format stores them as structured mappings; people edit them one per line:

    total = money of testid amount-due
    link = attribute href of link "Download CSV"
    issued = date "%d %b %Y" of css .issued
    invoices = rows of css "tbody tr" with number: css "td:nth-child(1)" amount: css .amount

    page shows "Payment submitted"
    page does not show "Error"
    address matches **/receipts/*
    count of css "tbody tr" == 10
    outputs.total == params.amount
"""

from __future__ import annotations

import shlex
from typing import Any

from pydantic import ValidationError

from sessions.engine.steps.assertion import (
    CHECK_ADAPTER,
    CompareCheck,
    CountCheck,
    TextCheck,
    UrlCheck,
)
from sessions.engine.steps.extract import ExtractField
from sessions.engine.steps.language import Target

OPERATORS = ("==", "!=", "<=", ">=", "<", ">", "contains")


class LineError(ValueError):
    pass


def _quote(value: str) -> str:
    return (
        shlex.quote(value) if any(c.isspace() or c in "'\"" for c in value) or not value else value
    )


def _validation_message(exc: ValidationError) -> str:
    error = exc.errors()[0]
    loc = ".".join(str(p) for p in error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{loc}: {message}" if loc else message


def _target(tokens: list[str]) -> Target:
    if not tokens:
        raise LineError('a target is missing (e.g. css .total or button "Pay")')
    return Target.from_compact(" ".join(shlex.quote(t) for t in tokens))


def _split(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise LineError(f"cannot read this line: {exc}") from None


# Extract fields ---------------------------------------------------------------------------------


def format_extract_field(field: ExtractField) -> str:
    head = f"{field.name} = {field.kind}"
    if field.kind == "attribute":
        head += f" {field.attribute}"
    if field.kind == "date" and field.date_format:
        head += f" {_quote(field.date_format)}"
    text = f"{head} of {field.target.to_compact()}"
    if field.columns:
        text += " with " + " ".join(
            f"{name}: {t.to_compact()}" for name, t in field.columns.items()
        )
    return text


def parse_extract_field(line: str) -> dict[str, Any]:
    name, sep, rest = line.partition("=")
    if not sep:
        raise LineError("write it as: name = kind of target (e.g. total = money of css .total)")
    tokens = _split(rest)
    if not tokens:
        raise LineError(
            "say what kind of value to extract: text, number, money, date, attribute, rows"
        )
    data: dict[str, Any] = {"name": name.strip(), "kind": tokens.pop(0)}
    if data["kind"] == "attribute":
        if not tokens or tokens[0] == "of":
            raise LineError('say which attribute, e.g. link = attribute href of link "Download"')
        data["attribute"] = tokens.pop(0)
    if data["kind"] == "date" and tokens and tokens[0] != "of":
        data["date_format"] = tokens.pop(0)
    if not tokens or tokens[0] != "of":
        raise LineError("expected 'of' before the target")
    tokens.pop(0)
    target_tokens, columns = tokens, None
    if "with" in tokens:
        cut = tokens.index("with")
        target_tokens, columns = tokens[:cut], _columns(tokens[cut + 1 :])
    try:
        data["target"] = _target(target_tokens)
        if columns is not None:
            data["columns"] = columns
        return ExtractField.model_validate(data).model_dump(mode="json", exclude_defaults=True)
    except ValidationError as exc:
        raise LineError(_validation_message(exc)) from None


def _columns(tokens: list[str]) -> dict[str, Target]:
    columns: dict[str, list[str]] = {}
    current: str | None = None
    for token in tokens:
        if token.endswith(":") and len(token) > 1:
            current = token[:-1]
            columns[current] = []
        elif current is None:
            raise LineError("after 'with', name each column: with number: css td.number")
        else:
            columns[current].append(token)
    if not columns:
        raise LineError("after 'with', name at least one column")
    return {name: _target(target) for name, target in columns.items()}


# Checks -----------------------------------------------------------------------------------------


def format_check(check: Any) -> str:
    if isinstance(check, TextCheck):
        verb = "shows" if check.kind == "text_present" else "does not show"
        return f"page {verb} {_quote(check.text)}"
    if isinstance(check, UrlCheck):
        return f"address matches {_quote(check.pattern)}"
    if isinstance(check, CountCheck):
        return f"count of {check.target.to_compact()} {check.op} {check.count}"
    assert isinstance(check, CompareCheck)
    return f"{_quote(check.left)} {check.op} {_quote(check.right)}"


def parse_check(line: str) -> dict[str, Any]:
    tokens = _split(line)
    data: dict[str, Any]
    if tokens[:2] == ["page", "shows"] and len(tokens) == 3:
        data = {"kind": "text_present", "text": tokens[2]}
    elif tokens[:4] == ["page", "does", "not", "show"] and len(tokens) == 5:
        data = {"kind": "text_absent", "text": tokens[4]}
    elif tokens[:2] == ["address", "matches"] and len(tokens) == 3:
        data = {"kind": "url_matches", "pattern": tokens[2]}
    elif tokens[:2] == ["count", "of"]:
        if len(tokens) < 5 or tokens[-2] not in OPERATORS:
            raise LineError(
                'write it as: count of <target> == 3 (e.g. count of css "tbody tr" >= 1)'
            )
        try:
            data = {
                "kind": "element_count",
                "target": _target(tokens[2:-2]),
                "op": tokens[-2],
                "count": tokens[-1],
            }
        except ValueError as exc:
            raise LineError(str(exc)) from None
    elif len(tokens) == 3 and tokens[1] in OPERATORS:
        data = {"kind": "compare", "left": tokens[0], "op": tokens[1], "right": tokens[2]}
    else:
        raise LineError(
            'not a check; use: page shows "…", page does not show "…", address matches …, '
            "count of <target> == N, or outputs.x == params.y"
        )
    try:
        return dict(
            CHECK_ADAPTER.validate_python(data).model_dump(mode="json", exclude_defaults=True)
        )
    except ValidationError as exc:
        raise LineError(_validation_message(exc)) from None


def parse_lines(text: str, parse: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """Parse non-empty lines; errors name their line number."""
    items, errors = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            items.append(parse(line.strip()))
        except (LineError, ValueError) as exc:
            errors.append(f"line {number}: {exc}")
    return items, errors
