"""The workflow file format: parameters, settings, the session block and the document, with the
rules that span steps (no Django imports).

Everything a run will do is described here and validated strictly: unknown fields are errors,
every step kind has its own model (``sessions.engine.steps``, one module per kind; the union
below is read off their registry), and cross-step rules (references to parameters, credentials
and extracted outputs, hosts outside the allowlist, duplicate ids) are checked on the whole
document by :func:`document_problems`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import Field, TypeAdapter, ValidationInfo, field_validator, model_validator

from sessions.engine import steps as step_kinds
from sessions.engine.steps.base import Problem, StepBase, StepScope, url_problem
from sessions.engine.steps.language import (
    CREDENTIAL_FIELDS,
    IDENTIFIER,
    IRREVERSIBLE_WORDS,
    TEMPLATE,
    Strict,
    Target,
    references,
)
from workflows.hosts import HostPatternError, parse_host_pattern
from workflows.money import MoneyError, parse_money

FORMAT_VERSION: Literal[1] = 1

# Every list of step kinds (the union, the palette, the file format's tags, the session's kinds)
# is read off the registry, in its order: a kind is added in one place.
STEP_CLASSES: tuple[type[StepBase], ...] = tuple(kind.model for kind in step_kinds.kinds())
if TYPE_CHECKING:
    Step = StepBase
else:
    Step = Annotated[Union[STEP_CLASSES], Field(discriminator="type")]  # noqa: UP007
STEP_ADAPTER: TypeAdapter[StepBase] = TypeAdapter(Step)
STEP_TYPES: tuple[str, ...] = tuple(step_kinds.kind_name(cls) for cls in STEP_CLASSES)
STEP_LABELS: dict[str, str] = {
    kind: cls.label for kind, cls in zip(STEP_TYPES, STEP_CLASSES, strict=True)
}
# The editor's fields of each kind (``workflows.forms.StepForm``'s names).
STEP_EDITOR_FIELDS: dict[str, tuple[str, ...]] = {
    kind: cls.editor_fields for kind, cls in zip(STEP_TYPES, STEP_CLASSES, strict=True)
}


# Parameters -------------------------------------------------------------------------------------


# Launch values are bounded whatever the workflow says: a value becomes part of the run, its audit
# event and every export of the trail. A string parameter may lower or raise its own maximum up
# to the cap; the other types have a fixed one that any real value fits in.
STRING_MAX_LENGTH_DEFAULT = 1_000
STRING_MAX_LENGTH_CAP = 10_000
OTHER_MAX_LENGTH = 64
CURRENCY_CODE = re.compile(r"[A-Z]{3}")
_PLAIN_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)", re.ASCII)


class Parameter(Strict):
    name: str = Field(pattern=IDENTIFIER)
    type: Literal["string", "number", "money", "date", "enum", "boolean"]
    label: str = Field(default="", max_length=200)
    help: str = Field(default="", max_length=500)
    required: bool = True
    default: str | None = Field(default=None, max_length=500)
    min_length: int | None = Field(default=None, ge=0)
    max_length: int | None = Field(default=None, ge=1, le=STRING_MAX_LENGTH_CAP)
    pattern: str | None = Field(default=None, max_length=500)
    minimum: str | None = None
    maximum: str | None = None
    currency: str | None = Field(default=None, pattern=r"^[A-Z]{3}$")
    # Money only: the amount is written with a decimal comma (1.234,56) instead of a point.
    decimal_comma: bool | None = None
    choices: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = None

    @model_validator(mode="after")
    def _options_fit_type(self) -> Parameter:
        allowed = {
            "string": {"min_length", "max_length", "pattern"},
            "number": {"minimum", "maximum"},
            "money": {"minimum", "maximum", "currency", "decimal_comma"},
            "date": {"minimum", "maximum"},
            "enum": {"choices"},
            "boolean": set(),
        }[self.type]
        options = (
            "min_length",
            "max_length",
            "pattern",
            "minimum",
            "maximum",
            "currency",
            "decimal_comma",
            "choices",
        )
        for option in options:
            if getattr(self, option) is not None and option not in allowed:
                raise ValueError(f"'{option}' does not apply to a {self.type} parameter")
        if self.type == "money" and self.currency is None:
            raise ValueError("a money parameter needs a currency, e.g. currency: EUR")
        if self.type == "enum" and not self.choices:
            raise ValueError("an enum parameter needs a list of choices")
        if self.pattern is not None:
            try:
                re.compile(self.pattern, re.ASCII)
            except re.error as exc:
                raise ValueError(f"'pattern' is not a regular expression: {exc}") from None
        for bound in ("minimum", "maximum"):
            value = getattr(self, bound)
            if value is not None:
                self._convert(value, f"'{bound}'")
        if self.default is not None:
            self.coerce(self.default)
        return self

    def coerce(self, raw: Any) -> Any:
        """Turn a launch value into its typed form, or raise ValueError saying why not."""
        if raw is None or (isinstance(raw, str) and raw.strip() == ""):
            if self.default is not None:
                raw = self.default
            elif self.required:
                raise ValueError("is required")
            else:
                return None
        if self.type == "boolean":
            return _coerce_bool(raw)
        text = str(raw).strip()
        if len(text) > self.longest:
            raise ValueError(f"must be at most {self.longest} characters")
        if self.type == "string":
            if self.min_length is not None and len(text) < self.min_length:
                raise ValueError(f"must be at least {self.min_length} characters")
            # ASCII: the pattern is published in the JSON Schema, where \d and \w mean ASCII
            # digits and word characters, not Python's Unicode classes.
            if self.pattern is not None and not re.fullmatch(self.pattern, text, re.ASCII):
                raise ValueError(f"must match the pattern {self.pattern}")
            return text
        if self.type == "enum":
            if text not in (self.choices or []):
                raise ValueError(f"must be one of: {', '.join(self.choices or [])}")
            return text
        value = self._convert(text, "the value")
        if self.minimum is not None and value < self._convert(self.minimum, "minimum"):
            raise ValueError(f"must be at least {self.minimum}")
        if self.maximum is not None and value > self._convert(self.maximum, "maximum"):
            raise ValueError(f"must be at most {self.maximum}")
        return value

    @property
    def longest(self) -> int:
        """The most characters a launch value of this parameter may have."""
        if self.type == "string":
            return self.max_length or STRING_MAX_LENGTH_DEFAULT
        if self.type == "enum":
            return max(len(choice) for choice in self.choices or [""])
        return OTHER_MAX_LENGTH

    def _convert(self, text: str, what: str) -> Any:
        if self.type == "date":
            try:
                return date.fromisoformat(text)
            except ValueError:
                raise ValueError(f"{what} must be a date like 2026-11-30") from None
        if self.type == "money":
            try:
                return parse_money(
                    text, currency=self.currency or "", decimal_comma=bool(self.decimal_comma)
                )
            except MoneyError as exc:
                # The options are written by the workflow's author, the value by whoever launches.
                raise ValueError(str(exc) if what == "the value" else f"{what}: {exc}") from None
        if len(text) > OTHER_MAX_LENGTH or not _PLAIN_NUMBER.fullmatch(text):
            raise ValueError(f"{what} must be a number like 12.5, not '{text[:OTHER_MAX_LENGTH]}'")
        try:
            return Decimal(text)
        except InvalidOperation:  # pragma: no cover (the pattern admits only plain decimals)
            raise ValueError(f"{what} must be a number, not '{text}'") from None

    def describe(self) -> str:
        extra = {
            "money": f" in {self.currency}",
            "enum": f" ({' / '.join(self.choices or [])})",
        }.get(self.type, "")
        return f"{self.label or self.name}: {self.type}{extra}" + (
            "" if self.required else ", optional"
        )


def _coerce_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in {"true", "yes", "on", "1"}:
        return True
    if text in {"false", "no", "off", "0"}:
        return False
    raise ValueError("must be yes or no")


# The document -----------------------------------------------------------------------------------


# The approval options that reach reviewers outside the page (chat, passkeys) and the facts they
# decide on; a workflow keeps them together, beside its quorum and expiry.
APPROVAL_REACH_OPTIONS = ("slack_channel", "passkey", "passkey_above_amount", "facts")


# What a reviewer decides on, in the order every card shows them.
DECISION_FACTS: dict[str, str] = {"amount": "Amount", "payee": "Payee", "reference": "Reference"}


class DecisionFacts(Strict):
    """Which values a reviewer decides on, each named by a parameter or an extracted output: every
    card, list and message shows them as text, and the gate compares them with the page.

    Without an ``amount``, the workflow's money parameter is the amount. ``currency`` is a code
    (EUR) or names the value that holds it; a money parameter brings its own."""

    amount: str | None = Field(
        default=None,
        title="Amount",
        description="The parameter or extracted output holding the amount; empty: the money "
        "parameter.",
    )
    currency: str | None = Field(
        default=None,
        title="Currency",
        description="A code (EUR) or the parameter or output holding it; a money parameter "
        "brings its own.",
    )
    payee: str | None = Field(
        default=None,
        title="Payee",
        description="The parameter or output naming who is paid (a name, an IBAN).",
    )
    reference: str | None = Field(
        default=None,
        title="Reference",
        description="The parameter or output identifying what is paid (an invoice number).",
    )

    @field_validator("amount", "payee", "reference", "currency")
    @classmethod
    def _names_a_value(cls, name: str | None, info: ValidationInfo) -> str | None:
        if name is None or re.fullmatch(IDENTIFIER, name):
            return name
        if info.field_name == "currency" and CURRENCY_CODE.fullmatch(name):
            return name
        code = " or a currency code (EUR)" if info.field_name == "currency" else ""
        raise ValueError(
            f"'{name[:80]}' is not the name of a parameter or output (lowercase letters, digits "
            f"and _, like payee_iban){code}"
        )


@dataclass(frozen=True)
class FactSource:
    """Where the run finds one decision fact: an input (``params``) or an output."""

    fact: str  # a key of DECISION_FACTS
    name: str
    source: Literal["input", "output"]
    money: bool = False
    currency: str = ""  # a code, when known before the run
    currency_from: str = ""  # or the input or output holding it


_SLACK_CHANNEL = re.compile(r"[CGD][A-Z0-9]{6,20}|#?[a-z0-9][a-z0-9._-]{0,79}")


class ApprovalPolicy(Strict):
    # Titles and descriptions are the settings form's labels and help, and the workflow page's
    # words for each setting: one place says what a setting means.
    quorum: int = Field(
        default=1, ge=1, le=5, title="Approvals needed", description="Distinct people."
    )
    expiry_minutes: int = Field(
        default=60,
        ge=1,
        le=7 * 24 * 60,
        title="Approval expires after (minutes)",
        description="Undecided by then, the request expires and the run stops before the step.",
    )
    author_may_approve: bool = Field(
        default=False, title="The version's author may approve its irreversible steps"
    )
    # Hand-over: 0 turns each off. A reminder goes to the reviewers this many minutes before
    # the request expires; after ``escalate_after_minutes`` undecided, ``escalation_group`` is
    # told and may decide too.
    remind_before_minutes: int = Field(
        default=0,
        ge=0,
        le=7 * 24 * 60,
        title="Remind the reviewers before expiry (minutes)",
        description="0: no reminder. Shorter than the expiry.",
    )
    escalate_after_minutes: int = Field(
        default=0,
        ge=0,
        le=7 * 24 * 60,
        title="Escalate an undecided request after (minutes)",
        description="0: never. The escalation group is told and may decide too.",
    )
    escalation_group: str = Field(default="", max_length=150, title="Escalation group")

    # A Slack channel id (C0123ABCD) or name (#payments) where requests are posted as cards.
    slack_channel: str | None = Field(
        default=None,
        title="Slack channel",
        description="Where requests are posted as cards reviewers decide from: a channel id "
        "(C0123ABCD) or name (#payments). Empty: no Slack.",
    )
    # A fresh passkey assertion with every verdict: never, always, or when the request's amount
    # (the workflow's money parameter) is above ``passkey_above_amount``.
    passkey: Literal["never", "always", "above"] = Field(
        default="never",
        title="Passkey with every verdict",
        description="A reviewer confirms each decision with a fresh passkey: never, always, or "
        "when the request's amount (its decision facts' amount) is above an amount.",
    )
    passkey_above_amount: Decimal | None = Field(
        default=None,
        ge=0,
        decimal_places=2,
        title="Passkey above the amount",
        description="Only with “above an amount”, e.g. 1000.00.",
    )
    facts: DecisionFacts = Field(default_factory=DecisionFacts)

    @field_validator("slack_channel")
    @classmethod
    def _slack_channel_written_right(cls, channel: str | None) -> str | None:
        if channel is not None and not _SLACK_CHANNEL.fullmatch(channel):
            raise ValueError(
                f"'{channel[:80]}' is not a Slack channel: give its id (C0123ABCD) or its name "
                "in lowercase (#payments)"
            )
        return channel

    @model_validator(mode="after")
    def _escalation_complete(self) -> ApprovalPolicy:
        if self.escalate_after_minutes and not self.escalation_group.strip():
            raise ValueError("escalate_after_minutes needs an escalation_group to escalate to")
        if self.escalate_after_minutes and self.escalate_after_minutes >= self.expiry_minutes:
            raise ValueError("escalate_after_minutes must be shorter than expiry_minutes")
        if self.remind_before_minutes and self.remind_before_minutes >= self.expiry_minutes:
            raise ValueError("remind_before_minutes must be shorter than expiry_minutes")
        return self

    @model_validator(mode="after")
    def _passkey_amount(self) -> ApprovalPolicy:
        if self.passkey == "above" and self.passkey_above_amount is None:
            raise ValueError("passkey: above needs passkey_above_amount, e.g. 1000.00")
        if self.passkey != "above" and self.passkey_above_amount is not None:
            raise ValueError("passkey_above_amount is used only with passkey: above")
        return self


# The settings of a run's filmstrip, kept together on the workflow until it is published.
RECORDING_OPTIONS: tuple[str, ...] = (
    "filmstrip",
    "filmstrip_seconds_per_frame",
    "filmstrip_max_mb",
)


class WorkflowSettings(Strict):
    allowed_hosts: list[Annotated[str, Field(min_length=1, max_length=260)]] = Field(
        min_length=1,
        max_length=50,
        title="Allowed hosts",
        description="One per line: portal.example.com, *.example.com (subdomains only), "
        "127.0.0.1:8001. The browser can reach nothing else.",
    )
    step_budget: int = Field(
        default=50, ge=1, le=1000, title="Step budget", description="Most steps a run may execute."
    )
    run_ttl_minutes: int = Field(default=15, ge=1, le=240, title="Run time limit (minutes)")
    # Batch launches keep at most this many runs of the workflow holding a browser at once.
    max_concurrent_runs: int = Field(
        default=3,
        ge=1,
        le=50,
        title="Runs at once",
        description="At most this many runs of the workflow hold a browser at once, however "
        "they were launched; the others wait in its queue, higher priority first, then oldest.",
    )
    approval: ApprovalPolicy = Field(default_factory=ApprovalPolicy)
    credentials: list[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]] = Field(
        default_factory=list,
        title="Credentials",
        description="The credentials this workflow's steps may use.",
    )
    # A filmstrip of the run's browser (masked frames, low rate, bounded size) kept with its
    # evidence: off unless a workflow asks for it.
    filmstrip: bool = Field(
        default=False,
        title="Keep a filmstrip of each run",
        description="Masked frames of the run's browser, kept with its evidence.",
    )
    filmstrip_seconds_per_frame: float = Field(
        default=2.0, ge=0.5, le=60.0, title="Seconds between filmstrip frames"
    )
    filmstrip_max_mb: int = Field(
        default=20,
        ge=1,
        le=500,
        title="Filmstrip size limit (MB)",
        description="Frames past it are dropped; the run goes on.",
    )

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts_parse(cls, hosts: list[str]) -> list[str]:
        normalized = []
        for host in hosts:
            try:
                normalized.append(str(parse_host_pattern(host)))
            except HostPatternError as exc:
                raise ValueError(str(exc)) from None
        return normalized


# What a session template may do: get to a logged-in page. Reading values, saving files and
# anything irreversible belong to the run's own steps, which see the run's parameters.
SESSION_STEP_TYPES: tuple[str, ...] = tuple(
    kind for kind, cls in zip(STEP_TYPES, STEP_CLASSES, strict=True) if cls.in_session
)


class SessionSpec(Strict):
    """Log in once, fork per run: the steps that log in, and how to tell a logged-in browser.

    A bake runs ``steps`` once with the workflow's credentials, opens ``check_url`` and expects
    ``logged_in`` there, then snapshots the browser; every run starts from that snapshot and
    checks ``logged_in`` at ``check_url`` before its first step.
    """

    steps: list[Step] = Field(min_length=1, max_length=50)
    check_url: str = Field(min_length=1, max_length=2000)
    logged_in: Target
    rebake_every_hours: int = Field(default=12, ge=1, le=168)


class WorkflowDocument(Strict):
    """One workflow version as a file: ``pandaweb: 1``, identity, settings, an optional session
    template, parameters, steps."""

    pandaweb: Literal[1] = FORMAT_VERSION
    name: str = Field(min_length=1, max_length=200)
    slug: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    description: str = Field(default="", max_length=5000)
    reviewer_group: str = Field(default="Reviewers", min_length=1, max_length=150)
    settings: WorkflowSettings
    session: SessionSpec | None = None
    parameters: list[Parameter] = Field(default_factory=list, max_length=50)
    steps: list[Step] = Field(default_factory=list, max_length=500)


# Cross-step rules -------------------------------------------------------------------------------


def document_problems(
    document: WorkflowDocument, *, credential_kinds: dict[str, str] | None = None
) -> list[Problem]:
    """Rules that span steps, parameters and settings. Empty list: the document may be published.

    ``credential_kinds`` maps the credentials that exist to their kind; None skips that check
    (a file validated away from any database).
    """
    problems: list[Problem] = []
    params = {p.name for p in document.parameters}
    if len(params) != len(document.parameters):
        seen: set[str] = set()
        for index, parameter in enumerate(document.parameters):
            if parameter.name in seen:
                problems.append(
                    Problem(path=("parameters", index, "name"), message="duplicate parameter name")
                )
            seen.add(parameter.name)
    scoped = set(document.settings.credentials)
    if credential_kinds is not None:
        for index, name in enumerate(document.settings.credentials):
            if name not in credential_kinds:
                problems.append(
                    Problem(
                        path=("settings", "credentials", index),
                        message=f"there is no credential named '{name}'",
                    )
                )
    scope = StepScope(
        hosts=[parse_host_pattern(h) for h in document.settings.allowed_hosts],
        params=params,
        scoped=scoped,
        credential_kinds=credential_kinds,
    )
    if document.session is not None:
        problems += _session_problems(document.session, scope)
    problems += _steps_problems(document.steps, ("steps",), scope)
    problems += _facts_problems(document, scope.outputs)
    return problems


def _facts_problems(document: WorkflowDocument, outputs: set[str]) -> list[Problem]:
    facts = document.settings.approval.facts
    parameters = {p.name: p for p in document.parameters}
    here = ("settings", "approval", "facts")
    problems = []
    for fact in (*DECISION_FACTS, "currency"):
        name = getattr(facts, fact)
        if name is None or (fact == "currency" and CURRENCY_CODE.fullmatch(name)):
            continue
        if name not in parameters and name not in outputs:
            problems.append(
                Problem(
                    path=(*here, fact),
                    message=f"there is no parameter or extracted output '{name}'",
                )
            )
    extracted = {
        field.name: field.kind
        for step in document.steps
        for field in getattr(step, "fields", [])
        if step.type == "extract"
    }
    kind = extracted.get(facts.amount or "")
    if facts.amount not in parameters and kind is not None and kind not in ("money", "number"):
        problems.append(
            Problem(
                path=(*here, "amount"),
                message=f"the amount must be extracted as money or a number; '{facts.amount}' "
                f"is extracted as {kind}",
            )
        )
    amount = parameters.get(facts.amount or "")
    if amount is not None and amount.type not in ("money", "number"):
        problems.append(
            Problem(
                path=(*here, "amount"),
                message=f"the amount must be a money or number parameter; '{amount.name}' is "
                f"a {amount.type}",
            )
        )
    if amount is not None and amount.type == "money" and facts.currency is not None:
        problems.append(
            Problem(
                path=(*here, "currency"),
                message=f"'{amount.name}' is a money parameter in {amount.currency}: it needs "
                "no currency",
            )
        )
    return problems


def decision_fact_sources(
    facts: DecisionFacts, parameter_list: Sequence[Parameter]
) -> list[FactSource]:
    """Where a run finds each decision fact its workflow declares (the money parameter stands
    for an undeclared amount)."""
    parameters = {p.name: p for p in parameter_list}
    amount_name = facts.amount or next((p.name for p in parameter_list if p.type == "money"), None)
    sources = []
    for fact in DECISION_FACTS:
        name = amount_name if fact == "amount" else getattr(facts, fact)
        if name is None:
            continue
        parameter = parameters.get(name)
        currency, currency_from = "", ""
        if fact == "amount":
            if parameter is not None and parameter.type == "money":
                currency = parameter.currency or ""
            elif facts.currency and CURRENCY_CODE.fullmatch(facts.currency):
                currency = facts.currency
            else:
                currency_from = facts.currency or ""
        sources.append(
            FactSource(
                fact=fact,
                name=name,
                source="input" if parameter is not None else "output",
                money=fact == "amount",
                currency=currency,
                currency_from=currency_from,
            )
        )
    return sources


def _session_problems(session: SessionSpec, scope: StepScope) -> list[Problem]:
    here: tuple[str | int, ...] = ("session",)
    problems = []
    for index, step in enumerate(session.steps):
        path = (*here, "steps", index)
        if step.type not in SESSION_STEP_TYPES:
            problems.append(
                Problem(
                    path=(*path, "type"),
                    message=f"a session template only logs in; {step.type} steps belong to the "
                    "run's steps",
                )
            )
        if step.irreversible:
            problems.append(
                Problem(
                    path=(*path, "irreversible"),
                    message="session steps run on every bake without anyone's approval; an "
                    "irreversible step belongs to the run's steps",
                )
            )
    session_scope = StepScope(
        hosts=scope.hosts,
        params=set(),
        scoped=scope.scoped,
        credential_kinds=scope.credential_kinds,
        session=True,
    )
    problems += _steps_problems(session.steps, (*here, "steps"), session_scope)
    scope.step_ids |= session_scope.step_ids
    scope.session_ids = set(session_scope.step_ids)
    if TEMPLATE.search(session.check_url):
        problems.append(
            Problem(
                path=(*here, "check_url"),
                message="the check URL is the same for every run: it cannot use {{ … }}",
            )
        )
    else:
        problem = url_problem(session.check_url, scope.hosts)
        if problem:
            problems.append(Problem(path=(*here, "check_url"), message=problem))
    return problems


def _steps_problems(
    steps: Sequence[StepBase], prefix: tuple[str | int, ...], scope: StepScope
) -> list[Problem]:
    problems: list[Problem] = []
    for index, step in enumerate(steps):
        here: tuple[str | int, ...] = (*prefix, index)
        problems += _common_problems(step, here, scope)
        problems += step.problems(here, scope)
    return problems


def _common_problems(
    step: StepBase, here: tuple[str | int, ...], scope: StepScope
) -> list[Problem]:
    problems: list[Problem] = []
    if step.id in scope.session_ids:
        problems.append(
            Problem(
                path=(*here, "id"),
                message=f"duplicate step id '{step.id}' (a session step has it)",
            )
        )
    elif step.id in scope.step_ids:
        problems.append(Problem(path=(*here, "id"), message=f"duplicate step id '{step.id}'"))
    scope.step_ids.add(step.id)
    # A session step cannot be irreversible at all; that problem is reported on its own.
    if step.irreversible and step.expect is None and not scope.session:
        problems.append(
            Problem(
                path=(*here, "expect"),
                message="an irreversible step must say how the portal shows that it worked "
                "(expect a text, an address or an element, e.g. expect: text: Payment "
                "submitted); without it a refused action would be reported as done",
            )
        )
    for field_name, text in step.all_templates():
        try:
            refs = references(text)
        except ValueError as exc:
            problems.append(Problem(path=(*here, field_name), message=str(exc)))
            continue
        for ns, name, sub in refs:
            problem = _reference_problem(ns, name, sub, field=field_name, step=step, scope=scope)
            if problem:
                problems.append(Problem(path=(*here, field_name), message=problem))
    return problems


def _reference_problem(
    ns: str, name: str, sub: str | None, *, field: str, step: StepBase, scope: StepScope
) -> str | None:
    if scope.session and ns in ("params", "outputs"):
        return (
            f"session steps run once for many runs, so they cannot use {ns} "
            f"('{{{{ {ns}.{name} }}}}')"
        )
    if ns == "params":
        if sub is not None or name not in scope.params:
            return f"there is no parameter '{name}'" if sub is None else "params have no fields"
        return None
    if ns == "outputs":
        if sub is not None or name not in scope.outputs:
            return f"no earlier step extracts an output '{name}'"
        if name in scope.codes and field not in step.secret_fields:
            return (
                f"'{name}' is a one-time code: it may only be typed into a field (the value of "
                "a fill step), where it is masked"
            )
        return None
    # Secrets may only be typed into a field: anywhere else (a URL, a waited-for text) they would
    # end up in observations, events and screenshots.
    if field not in step.secret_fields:
        return "secrets may only be used as the value of a fill step"
    if name not in scope.scoped:
        return f"credential '{name}' is not among this workflow's credentials"
    if sub is None:
        return f"say which field of credential '{name}', e.g. {{{{ secrets.{name}.password }}}}"
    kinds = scope.credential_kinds
    if kinds is not None and name in kinds:
        fields = CREDENTIAL_FIELDS[kinds[name]]
        if sub not in fields:
            return f"credential '{name}' has no field '{sub}' (it has: {', '.join(fields)})"
    elif sub not in {f for fields in CREDENTIAL_FIELDS.values() for f in fields}:
        return f"'{sub}' is not a credential field"
    return None


def credentials_used(steps: list[Any]) -> set[str]:
    """The credentials ``steps`` (validated or raw) type: only these are decrypted for them."""
    names = set()
    for data in steps:
        step = data if isinstance(data, StepBase) else STEP_ADAPTER.validate_python(data)
        names |= step.credentials()
    return names


def irreversible_warnings(
    steps: list[StepBase], opens_dialog: Mapping[str, Mapping[str, Any]] | None = None
) -> list[Problem]:
    """Steps that look like they do something final but are not marked irreversible. A step
    seen to only open a dialog (``opens_dialog``: step id → the fact, with the ``target`` it
    was seen for) is not one, as long as its target is the one it was seen with."""
    warnings = []
    for index, step in enumerate(steps):
        if step.irreversible or not step.warns_on_final_words:
            continue
        seen = (opens_dialog or {}).get(step.id)
        if seen is not None and [t.model_dump(exclude_defaults=True) for t in step.targets()] == [
            seen.get("target")
        ]:
            continue
        words = " ".join(t.readable_name + " " + (t.css or "") for t in step.targets())
        match = IRREVERSIBLE_WORDS.search(words)
        if match:
            warnings.append(
                Problem(
                    path=("steps", index, "irreversible"),
                    message=f"the target reads like '{match.group(0)}' but the step is not "
                    "marked irreversible: it would run without a second person's approval",
                )
            )
    return warnings


# Sentences --------------------------------------------------------------------------------------


def describe_step(step: StepBase) -> str:
    """One readable sentence, e.g. "Click the button 'Submit payment' — irreversible"."""
    text = step.sentence()
    if step.irreversible:
        text += " — irreversible"
    return text
