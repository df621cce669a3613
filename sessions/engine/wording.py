"""A run's values in text: references filled in for typing (secrets only into fields), and text
for people with this run's values in place and every secret masked."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from sessions.engine.plan import totp_code
from sessions.engine.steps.base import StepFailed
from sessions.engine.steps.language import references
from sessions.engine.vocabulary import MASK

if TYPE_CHECKING:
    from sessions.engine.runner import Runner


# A reference in a workflow's text, as people wrote it: ``{{ params.invoice }}``.
_REFERENCE = re.compile(
    r"\{\{\s*(params|secrets|outputs)\.([a-z][a-z0-9_-]*)(?:\.([a-z_]+))?\s*\}\}"
)


def fill_in(runner: Runner, template: str, *, secrets: bool = False) -> str:
    def value(namespace: str, name: str, sub: str | None) -> str:
        if namespace == "params":
            return plain(runner.plan.inputs.get(name, ""))
        if namespace == "outputs" and name in runner.code_names:
            if not secrets:
                raise StepFailed(f"the one-time code '{name}' may only be typed into a field")
            if name not in runner._codes:
                raise StepFailed(
                    f"the one-time code '{name}' was used up: a code is kept only until the "
                    "run next waits for a person"
                )
            return runner._codes[name]
        if namespace == "outputs":
            return plain(runner.outputs.get(name, ""))
        if not secrets:
            raise StepFailed("secrets may only be typed into fields")
        fields = runner.plan.secrets.get(name, {})
        if sub == "code" and "seed" in fields:
            return remember_secret(runner, totp_code(fields["seed"]))
        if sub is None or sub not in fields:
            raise StepFailed(f"credential '{name}' has no field '{sub}' in this run")
        return fields[sub]

    def replaced(match: re.Match[str]) -> str:
        return value(match.group(1), match.group(2), match.group(3))

    references(template)  # refuses anything that is not a plain reference
    return _REFERENCE.sub(replaced, template)


def remember_secret(runner: Runner, value: str) -> str:
    """``value``, from now on masked wherever this run shows text (a code made from a seed)."""
    if value and value not in runner.secret_values:
        runner.secret_values = sorted([*runner.secret_values, value], key=len, reverse=True)
    return value


def words(runner: Runner, text: str) -> str:
    """``text`` for people: references filled in with this run's values, as they were typed
    ("no link named 'INV-1040'"), secrets masked. A reference with no value yet stays."""

    def value(match: re.Match[str]) -> str:
        namespace, name = match.group(1), match.group(2)
        if namespace == "params" and name in runner.plan.inputs:
            return plain(runner.plan.inputs[name])
        if namespace == "outputs" and name in runner.code_names:
            return MASK
        if namespace == "outputs" and name in runner.outputs:
            return plain(runner.outputs[name])
        if namespace == "secrets":
            return MASK
        return match.group(0)

    return scrub(runner, _REFERENCE.sub(value, text)) if text else text


def scrub(runner: Runner, text: str) -> str:
    for secret in runner.secret_values:
        text = text.replace(secret, MASK)
    return text


def plain(value: Any) -> str:
    return str(value) if value is not None else ""


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "unknown error"


def clip(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
