"""The step kinds: one module each, holding the kind's model (its fields, rules, sentence and
editor fields) and how it acts on the page. Everything that lists kinds (the schema's union, the
editor's palette, the file format's tags, the session's kinds) reads them off this registry, in
its order: a new kind is its module here and one line in ``_KINDS``.

Another package may add a kind with :func:`register` before the workflow schema is built (at
start-up, before ``workflows.schema`` is imported).
"""

from __future__ import annotations

from typing import get_args

from sessions.engine.steps import (
    ask,
    assertion,
    check,
    click,
    download,
    extract,
    fill,
    goto,
    login,
    press,
    screenshot,
    select,
    uncheck,
    wait,
    wait_for,
)
from sessions.engine.steps.base import Act, StepBase, StepKind

_KINDS: list[StepKind] = [
    goto.KIND,
    login.KIND,
    click.KIND,
    fill.KIND,
    select.KIND,
    check.KIND,
    uncheck.KIND,
    press.KIND,
    wait_for.KIND,
    wait.KIND,
    extract.KIND,
    assertion.KIND,
    screenshot.KIND,
    download.KIND,
    ask.KIND,
]
_built = False


class RegistryClosed(RuntimeError):
    """A kind registered after the schema was built would validate nowhere."""


def register(kind: StepKind) -> None:
    """Add a step kind (its model's ``type`` must be new)."""
    if _built:
        raise RegistryClosed(
            "step kinds are registered before the workflow schema is built: register at "
            "start-up, before workflows.schema is imported"
        )
    name = kind_name(kind.model)
    if any(kind_name(known.model) == name for known in _KINDS):
        raise ValueError(f"there is already a step kind named {name!r}")
    _KINDS.append(kind)


def kinds() -> tuple[StepKind, ...]:
    """Every step kind, in the palette's order. The schema's first call closes the registry."""
    global _built
    _built = True
    return tuple(_KINDS)


def kind_name(model: type[StepBase]) -> str:
    """The ``type`` a step of this kind has in a workflow file."""
    return str(get_args(model.model_fields["type"].annotation)[0])


def act_of(step: StepBase) -> Act | None:
    """How a step acts on the page (None: the runner handles it, as it does ``ask``)."""
    return next((kind.act for kind in _KINDS if kind.model is type(step)), None)
