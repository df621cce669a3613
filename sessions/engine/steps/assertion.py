"""Check the outcome on the page: texts, the address, counts, and comparisons of values; every
failing check is said."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, get_args

from pydantic import Field, TypeAdapter

from sessions.engine.steps.base import (
    Acting,
    Problem,
    StepBase,
    StepFailed,
    StepKind,
    StepRecord,
    StepScope,
)
from sessions.engine.steps.language import REFERENCE, Strict, Target, url_matches

if TYPE_CHECKING:
    from playwright.sync_api import Page

CompareOp = Literal["==", "!=", "<", "<=", ">", ">=", "contains"]


class TextCheck(Strict):
    kind: Literal["text_present", "text_absent"]
    text: str = Field(min_length=1, max_length=500)


class UrlCheck(Strict):
    kind: Literal["url_matches"]
    pattern: str = Field(min_length=1, max_length=2000)


class CountCheck(Strict):
    kind: Literal["element_count"]
    target: Target
    op: CompareOp = "=="
    count: int = Field(ge=0, le=10_000)


class CompareCheck(Strict):
    kind: Literal["compare"]
    left: str = Field(min_length=1, max_length=200)
    op: CompareOp
    right: str = Field(min_length=1, max_length=200)


Check = Annotated[TextCheck | UrlCheck | CountCheck | CompareCheck, Field(discriminator="kind")]
CHECK_ADAPTER: TypeAdapter[Any] = TypeAdapter(Check)
CHECK_KINDS: tuple[str, ...] = tuple(
    kind
    for cls in get_args(get_args(Check)[0])
    for kind in get_args(cls.model_fields["kind"].annotation)
)


class AssertStep(StepBase):
    type: Literal["assert"]
    label: ClassVar[str] = "Check the outcome"
    touches_page: ClassVar[bool] = False
    editor_fields: ClassVar[tuple[str, ...]] = ("checks_text",)
    checks: list[Check] = Field(min_length=1, max_length=50)

    def targets(self) -> list[Target]:
        return [c.target for c in self.checks if isinstance(c, CountCheck)]

    def sentence(self) -> str:
        return "Check that " + "; ".join(_check_sentence(c) for c in self.checks)

    def problems(self, here: tuple[str | int, ...], scope: StepScope) -> list[Problem]:
        problems = []
        for check_index, check in enumerate(self.checks):
            if isinstance(check, CompareCheck):
                for side in ("left", "right"):
                    problem = _operand_problem(getattr(check, side), scope)
                    if problem:
                        path = (*here, "checks", check_index, side)
                        problems.append(Problem(path=path, message=problem))
        return problems


def _check_sentence(check: Any) -> str:
    if isinstance(check, TextCheck):
        verb = "shows" if check.kind == "text_present" else "does not show"
        return f"the page {verb} '{check.text}'"
    if isinstance(check, UrlCheck):
        return f"the address matches {check.pattern}"
    if isinstance(check, CountCheck):
        return f"the number of {check.target.describe()} {check.op} {check.count}"
    return f"{check.left} {check.op} {check.right}"


def _operand_problem(operand: str, scope: StepScope) -> str | None:
    ref = REFERENCE.match(operand)
    if ref is None:
        return None  # a literal
    if ref["ns"] == "secrets":
        return "secrets cannot be compared"
    if scope.session:
        return f"session steps run once for many runs, so they cannot use {ref['ns']}"
    if ref["ns"] == "params" and ref["name"] not in scope.params:
        return f"there is no parameter '{ref['name']}'"
    if ref["ns"] == "outputs" and ref["name"] not in scope.outputs:
        return f"no earlier step extracts an output '{ref['name']}'"
    if ref["ns"] == "outputs" and ref["name"] in scope.codes:
        return f"'{ref['name']}' is a one-time code: it cannot be compared"
    return None


def act(runner: Acting, step: AssertStep, record: StepRecord, timeout: float) -> None:
    failures = [f for f in (check_failure(runner, runner.page, c) for c in step.checks) if f]
    if failures:
        raise StepFailed("; ".join(failures))


def check_failure(runner: Acting, page: Page, check: Any) -> str | None:
    """Why ``check`` does not hold on the page now, or None when it holds."""
    if isinstance(check, TextCheck):
        present = page.get_by_text(check.text).count() > 0
        if check.kind == "text_present" and not present:
            return f"the page does not show '{check.text}' ({page.url})"
        if check.kind == "text_absent" and present:
            return f"the page shows '{check.text}' ({page.url})"
        return None
    if isinstance(check, UrlCheck):
        if not url_matches(page.url, check.pattern):
            return f"the address {page.url} does not match {check.pattern}"
        return None
    if isinstance(check, CountCheck):
        count = runner.locate(page, check.target, strict=False).count()
        if not _compare(count, check.op, check.count):
            return f"found {count} of {check.target.describe()}, expected {check.op} {check.count}"
        return None
    assert isinstance(check, CompareCheck)
    left, right = _operand(runner, check.left), _operand(runner, check.right)
    if not _compare(left, check.op, right):
        return f"{check.left} ({left}) {check.op} {check.right} ({right}) is not true"
    return None


def _operand(runner: Acting, text: str) -> Any:
    namespace, _, name = text.partition(".")
    if namespace == "outputs" and name in runner.outputs:
        return runner.outputs[name]
    if namespace == "params" and name in runner.plan.inputs:
        return runner.plan.inputs[name]
    if namespace in ("outputs", "params"):
        raise StepFailed(f"{text} has no value in this run")
    return text


def _compare(left: Any, op: str, right: Any) -> bool:
    if op == "contains":
        return str(right) in str(left)
    try:
        a: Any = Decimal(str(left).replace(",", ""))
        b: Any = Decimal(str(right).replace(",", ""))
    except InvalidOperation:
        a, b = str(left), str(right)
    operations: dict[str, Callable[[Any, Any], bool]] = {
        "==": lambda x, y: x == y,
        "!=": lambda x, y: x != y,
        "<": lambda x, y: x < y,
        "<=": lambda x, y: x <= y,
        ">": lambda x, y: x > y,
        ">=": lambda x, y: x >= y,
    }
    return operations[op](a, b)


KIND = StepKind(AssertStep, act)
