"""The workflow file format: typed steps, parameters and settings (no Django imports).

Everything a run will do is described here and validated strictly: unknown fields are errors,
every step type has its own model, and cross-step rules (references to parameters, credentials
and extracted outputs, hosts outside the allowlist, duplicate ids) are checked on the whole
document by :func:`document_problems`.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Callable, Sequence
from datetime import date
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, ClassVar, Literal, get_args
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

from workflows.hosts import HostPatternError, host_allowed, parse_host_pattern
from workflows.money import MoneyError, parse_money

FORMAT_VERSION: Literal[1] = 1

IDENTIFIER = r"^[a-z][a-z0-9_]{0,62}$"
STEP_ID = r"^[a-z0-9][a-z0-9-]{0,62}$"

# The ARIA roles people target in portals; an unknown role is almost always a typo.
ARIA_ROLES = (
    "alert", "button", "cell", "checkbox", "columnheader", "combobox", "dialog", "gridcell",
    "heading", "img", "link", "listbox", "listitem", "menu", "menuitem", "navigation", "option",
    "radio", "region", "row", "rowheader", "searchbox", "slider", "spinbutton", "switch", "tab",
    "table", "tabpanel", "textbox", "tree", "treeitem",
)  # fmt: skip
AriaRole = Literal[ARIA_ROLES]  # type: ignore[valid-type]

LOCATOR_KINDS = ("role", "label", "placeholder", "text", "test_id", "css")
_KIND_WORDS = {"label": "label", "placeholder": "placeholder", "text": "text", "testid": "test_id"}

# Words that mark an action people cannot take back; a click on such a target that is not marked
# irreversible is flagged in the editor and at publish.
IRREVERSIBLE_WORDS = re.compile(
    r"\b(pay|submit|confirm|delete|remove|transfer|send|approve|purchase|buy|wire|refund)\b",
    re.IGNORECASE,
)

KEY_NAME = re.compile(
    r"^((Control|Shift|Alt|Meta)\+)*"
    r"(Enter|Tab|Escape|Backspace|Delete|Space|Home|End|PageUp|PageDown|Insert|"
    r"ArrowUp|ArrowDown|ArrowLeft|ArrowRight|F([1-9]|1[0-2])|[A-Za-z0-9])$"
)

TEMPLATE = re.compile(r"\{\{\s*(?P<ref>[^{}]*?)\s*\}\}")
REFERENCE = re.compile(
    r"^(?P<ns>params|secrets|outputs)\.(?P<name>[a-z][a-z0-9_-]*)(?:\.(?P<field>[a-z_]+))?$"
)

CREDENTIAL_FIELDS: dict[str, tuple[str, ...]] = {
    "username_password": ("username", "password"),
    "totp": ("code",),
    "api_token": ("token",),
}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


class Target(Strict):
    """An element, written the way people read a page."""

    role: AriaRole | None = None
    name: str | None = None
    label: str | None = None
    placeholder: str | None = None
    text: str | None = None
    test_id: str | None = None
    css: str | None = None
    exact: bool = False
    nth: int | None = Field(default=None, ge=0, le=999)
    frame: list[Annotated[str, Field(min_length=1, max_length=300)]] = Field(
        default_factory=list, max_length=5
    )

    @model_validator(mode="after")
    def _one_locator(self) -> Target:
        given = [kind for kind in LOCATOR_KINDS if getattr(self, kind) not in (None, "")]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of role, label, placeholder, text, test_id or css"
                + (f" (got {', '.join(given)})" if given else "")
            )
        if self.name is not None and self.role is None:
            raise ValueError("'name' goes with 'role' (e.g. role: button, name: Submit payment)")
        return self

    @property
    def kind(self) -> str:
        return next(kind for kind in LOCATOR_KINDS if getattr(self, kind) not in (None, ""))

    @property
    def readable_name(self) -> str:
        """The words a person would see on the page for this element ('' for bare CSS)."""
        if self.role:
            return self.name or ""
        return str(getattr(self, self.kind)) if self.kind != "css" else ""

    def describe(self) -> str:
        if self.role:
            text = f"the {self.role} '{self.name}'" if self.name else f"the {self.role}"
        elif self.kind == "css":
            text = f"the element matching {self.css}"
        elif self.kind == "test_id":
            text = f"the element with test id '{self.test_id}'"
        elif self.kind == "label":
            text = f"the field labelled '{self.label}'"
        elif self.kind == "placeholder":
            text = f"the field with placeholder '{self.placeholder}'"
        else:
            text = f"the text '{self.text}'"
        if self.nth is not None:
            text += f" (match #{self.nth + 1})"
        if self.frame:
            text += " in frame " + " › ".join(self.frame)
        return text

    def to_compact(self) -> str:
        """The one-line form used in the editor, e.g. ``button "Submit payment" exact``."""
        kind = self.kind
        word = self.role if kind == "role" else {"test_id": "testid"}.get(kind, kind)
        value = self.name if kind == "role" else getattr(self, kind)
        parts = [str(word)]
        if value:
            parts.append(shlex.quote(str(value)) if _needs_quotes(str(value)) else str(value))
        if self.exact:
            parts.append("exact")
        if self.nth is not None:
            parts.append(f"nth={self.nth}")
        parts += [f"frame={shlex.quote(f)}" for f in self.frame]
        return " ".join(parts)

    @classmethod
    def from_compact(cls, text: str) -> Target:
        """Parse the editor's one-line form; raises ValueError with a readable message."""
        try:
            tokens = shlex.split(text)
        except ValueError as exc:
            raise ValueError(f"cannot read the target: {exc}") from None
        if not tokens:
            raise ValueError("the target is empty")
        head, rest = tokens[0].lower(), tokens[1:]
        data: dict[str, Any] = {}
        value = rest.pop(0) if rest and not _is_option(rest[0]) else None
        if head == "css":
            data["css"] = value
        elif head in _KIND_WORDS:
            data[_KIND_WORDS[head]] = value
        elif head in ARIA_ROLES:
            data["role"] = head
            if value is not None:
                data["name"] = value
        else:
            raise ValueError(
                f"'{tokens[0]}' is not a role or one of label, placeholder, text, testid, css "
                '(examples: button "Submit payment", label Username, css "#total")'
            )
        if head != "css" and head not in ARIA_ROLES and value is None:
            raise ValueError(f'say which {head}, e.g. {head} "Username"')
        frames: list[str] = []
        for option in rest:
            if option == "exact":
                data["exact"] = True
            elif option.startswith("nth="):
                data["nth"] = option[4:]
            elif option.startswith("frame="):
                frames.append(option[6:])
            else:
                raise ValueError(f"unknown option '{option}' (use exact, nth=N or frame=SELECTOR)")
        if frames:
            data["frame"] = frames
        return cls.model_validate(data)


def _needs_quotes(value: str) -> bool:
    return not re.fullmatch(r"[\w.#\-]+", value) or _is_option(value)


def _is_option(token: str) -> bool:
    return token == "exact" or token.startswith(("nth=", "frame="))  # noqa: S105


# Steps ------------------------------------------------------------------------------------------


class Expect(Strict):
    """How the portal shows that an irreversible action worked: exactly one of a text that
    appears, an address the browser comes to (a glob, ``**`` crossing slashes) or an element
    that appears. Until the runner sees it, the action is not reported as done."""

    text: str | None = Field(default=None, min_length=1, max_length=500)
    url: str | None = Field(default=None, min_length=1, max_length=2000)
    target: Target | None = None

    @model_validator(mode="after")
    def _one_outcome(self) -> Expect:
        given = [name for name in ("text", "url", "target") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                "expect exactly one of: text (shown on the page), url (where the browser "
                "ends up) or target (an element that appears)"
                + (f" (got {', '.join(given)})" if given else "")
            )
        return self

    @property
    def kind(self) -> str:
        return "text" if self.text is not None else "url" if self.url is not None else "target"

    def describe(self) -> str:
        if self.text is not None:
            return f"the page shows '{self.text}'"
        if self.url is not None:
            return f"the address matches {self.url}"
        assert self.target is not None
        return f"{self.target.describe()} appears"

    def templates(self) -> list[tuple[str, str]]:
        return [
            (f"expect.{name}", value)
            for name, value in (("text", self.text), ("url", self.url))
            if value is not None
        ]


class StepBase(Strict):
    # What the editor's palette calls the kind, and whether a session template may use it (to
    # get to a logged-in page; reading values, saving files and asking belong to the run).
    label: ClassVar[str]
    in_session: ClassVar[bool] = True

    id: str = Field(pattern=STEP_ID, description="unique within the workflow, e.g. open-login")
    description: str = Field(default="", max_length=500)
    irreversible: bool = False
    timeout_ms: int = Field(default=10_000, ge=100, le=300_000)
    # Required (at publish) on irreversible steps: what the portal shows when the action worked.
    expect: Expect | None = None

    def targets(self) -> list[Target]:
        return [v for v in self.__dict__.values() if isinstance(v, Target)]

    def templates(self) -> list[tuple[str, str]]:
        """(field, text) pairs whose text may contain ``{{ … }}`` references."""
        return []

    def all_templates(self) -> list[tuple[str, str]]:
        """:meth:`templates` and those of the expected outcome."""
        return self.templates() + (self.expect.templates() if self.expect else [])

    def sentence(self) -> str:
        """What the step does, in one sentence a person reads (each kind says its own)."""
        return self.id


class GotoStep(StepBase):
    type: Literal["goto"]
    label: ClassVar[str] = "Go to a page"
    url: str = Field(min_length=1, max_length=2000)

    def templates(self) -> list[tuple[str, str]]:
        return [("url", self.url)]

    def sentence(self) -> str:
        return f"Go to {self.url}"


class ClickStep(StepBase):
    type: Literal["click"]
    label: ClassVar[str] = "Click"
    target: Target
    # What to do with a confirm()/alert()/prompt() the click opens; a dialog the step does not
    # declare fails it (nobody says yes on the workflow's behalf).
    dialog: Literal["accept", "dismiss"] | None = None
    prompt_text: str | None = Field(default=None, max_length=500)

    @model_validator(mode="after")
    def _prompt_with_accept(self) -> ClickStep:
        if self.prompt_text is not None and self.dialog != "accept":
            raise ValueError(
                "'prompt_text' is typed into a prompt() it accepts: add dialog: accept"
            )
        return self

    def templates(self) -> list[tuple[str, str]]:
        return [("prompt_text", self.prompt_text)] if self.prompt_text is not None else []

    def sentence(self) -> str:
        if self.dialog is not None:
            return f"Click {self.target.describe()} and {self.dialog} the dialog it opens"
        return f"Click {self.target.describe()}"


class FillStep(StepBase):
    type: Literal["fill"]
    label: ClassVar[str] = "Fill a field"
    target: Target
    value: str = Field(max_length=5000)

    def templates(self) -> list[tuple[str, str]]:
        return [("value", self.value)]

    def sentence(self) -> str:
        return f"Fill {self.target.describe()} with {_fill_value(self.value)}"


class SelectStep(StepBase):
    type: Literal["select"]
    label: ClassVar[str] = "Choose an option"
    target: Target
    option: str = Field(min_length=1, max_length=300)

    def templates(self) -> list[tuple[str, str]]:
        return [("option", self.option)]

    def sentence(self) -> str:
        return f"Choose '{self.option}' in {self.target.describe()}"


class CheckStep(StepBase):
    type: Literal["check"]
    label: ClassVar[str] = "Tick"
    target: Target

    def sentence(self) -> str:
        return f"Tick {self.target.describe()}"


class UncheckStep(StepBase):
    type: Literal["uncheck"]
    label: ClassVar[str] = "Untick"
    target: Target

    def sentence(self) -> str:
        return f"Untick {self.target.describe()}"


class PressStep(StepBase):
    type: Literal["press"]
    label: ClassVar[str] = "Press a key"
    key: str
    target: Target | None = None

    @field_validator("key")
    @classmethod
    def _known_key(cls, key: str) -> str:
        if not KEY_NAME.match(key):
            raise ValueError(
                f"'{key}' is not a key name (examples: Enter, Tab, Escape, ArrowDown, Control+A)"
            )
        return key

    def sentence(self) -> str:
        where = f" in {self.target.describe()}" if self.target else ""
        return f"Press {self.key}{where}"


class WaitForStep(StepBase):
    type: Literal["wait_for"]
    label: ClassVar[str] = "Wait for"
    target: Target | None = None
    state: Literal["visible", "hidden"] = "visible"
    url: str | None = Field(default=None, min_length=1, max_length=2000)
    text: str | None = Field(default=None, min_length=1, max_length=500)
    network_idle: bool = False

    @model_validator(mode="after")
    def _one_condition(self) -> WaitForStep:
        given = [
            name
            for name, present in (
                ("target", self.target is not None),
                ("url", self.url is not None),
                ("text", self.text is not None),
                ("network_idle", self.network_idle),
            )
            if present
        ]
        if len(given) != 1:
            raise ValueError(
                "wait for exactly one of: target (with state), url, text, network_idle"
            )
        return self

    def templates(self) -> list[tuple[str, str]]:
        return [(name, value) for name, value in (("url", self.url), ("text", self.text)) if value]

    # A fixed pause is for portals that need time nothing on the page shows (a rate limit, a
    # back-end job); anything longer than this should wait for what the page shows instead.

    def sentence(self) -> str:
        if self.target is not None:
            return f"Wait until {self.target.describe()} is {self.state}"
        if self.url is not None:
            return f"Wait until the address matches {self.url}"
        if self.text is not None:
            return f"Wait until the page shows '{self.text}'"
        return "Wait until the network is idle"


WAIT_LIMIT_SECONDS = 60


class WaitStep(StepBase):
    type: Literal["wait"]
    label: ClassVar[str] = "Pause"
    seconds: float

    @field_validator("seconds")
    @classmethod
    def _bounded(cls, seconds: float) -> float:
        if not 0 < seconds <= WAIT_LIMIT_SECONDS:
            raise ValueError(
                f"a wait lasts more than 0 and at most {WAIT_LIMIT_SECONDS} seconds (got "
                f"{seconds:g}); to wait longer, wait_for what the page shows when it is ready"
            )
        return seconds

    def sentence(self) -> str:
        return f"Wait {self.seconds:g} second{'' if self.seconds == 1 else 's'}"


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
    in_session: ClassVar[bool] = False
    fields: list[ExtractField] = Field(min_length=1, max_length=50)

    def targets(self) -> list[Target]:
        return [f.target for f in self.fields]

    def sentence(self) -> str:
        names = ", ".join(f"{f.name} ({f.kind})" for f in self.fields)
        return f"Extract {names}"


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
    checks: list[Check] = Field(min_length=1, max_length=50)

    def targets(self) -> list[Target]:
        return [c.target for c in self.checks if isinstance(c, CountCheck)]

    def sentence(self) -> str:
        return "Check that " + "; ".join(_check_sentence(c) for c in self.checks)


class ScreenshotStep(StepBase):
    type: Literal["screenshot"]
    label: ClassVar[str] = "Screenshot"
    in_session: ClassVar[bool] = False
    name: str = Field(pattern=IDENTIFIER)
    full_page: bool = False

    def sentence(self) -> str:
        return f"Take a screenshot '{self.name}'"


class DownloadStep(StepBase):
    type: Literal["download"]
    label: ClassVar[str] = "Download a file"
    in_session: ClassVar[bool] = False
    target: Target
    name: str = Field(pattern=IDENTIFIER)

    def sentence(self) -> str:
        return f"Download '{self.name}' by clicking {self.target.describe()}"


class LoginStep(StepBase):
    type: Literal["login"]
    label: ClassVar[str] = "Log in"
    credential: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    username: Target
    password: Target
    submit: Target

    # Who may answer an ``ask`` step: the person who launched the run, or a group's members.

    def sentence(self) -> str:
        return f"Log in with credential '{self.credential}', then click {self.submit.describe()}"


ASK_LAUNCHER = "launcher"
# What a one-time code may look like: SMS, e-mail and authenticator codes, with the dashes and
# spaces people copy along (they are removed before the code is typed).
ONE_TIME_CODE = re.compile(r"^[A-Za-z0-9]{3,12}$")


class AskStep(StepBase):
    """Ask a person and wait (holding no worker) for the answer, which later steps use as
    ``{{ outputs.<save_as> }}``. A one-time code is masked everywhere and never stored in clear."""

    type: Literal["ask"]
    label: ClassVar[str] = "Ask a person"
    in_session: ClassVar[bool] = False
    question: str = Field(min_length=1, max_length=500)
    answer: Literal["text", "code", "choice"] = "text"
    options: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list, max_length=20
    )
    save_as: str = Field(pattern=IDENTIFIER)
    # "launcher" or the name of a group whose members may answer.
    answered_by: str = Field(default=ASK_LAUNCHER, min_length=1, max_length=150)
    timeout_minutes: int = Field(default=10, ge=1, le=24 * 60)

    @model_validator(mode="after")
    def _options_fit_answer(self) -> AskStep:
        if self.answer == "choice":
            if len(self.options) < 2:
                raise ValueError("a choice needs at least two options to choose from")
            if len({o.casefold() for o in self.options}) != len(self.options):
                raise ValueError("the options of a choice must differ from each other")
        elif self.options:
            raise ValueError(f"'options' belong to answer: choice, not answer: {self.answer}")
        if self.irreversible:
            raise ValueError(
                "asking a person changes nothing on the portal: an ask step is never irreversible"
            )
        return self

    def templates(self) -> list[tuple[str, str]]:
        return [("question", self.question)]

    def sentence(self) -> str:
        return f"Ask {ask_audience(self.answered_by)}: '{self.question}'"


Step = Annotated[
    GotoStep
    | LoginStep
    | ClickStep
    | FillStep
    | SelectStep
    | CheckStep
    | UncheckStep
    | PressStep
    | WaitForStep
    | WaitStep
    | ExtractStep
    | AssertStep
    | ScreenshotStep
    | DownloadStep
    | AskStep,
    Field(discriminator="type"),
]
STEP_ADAPTER: TypeAdapter[Step] = TypeAdapter(Step)
# Every list of step kinds (the palette, the file format's tags, the session's kinds) is read
# off the union above, in its order: a kind is added in one place.
STEP_CLASSES: tuple[type[StepBase], ...] = get_args(get_args(Step)[0])
STEP_TYPES: tuple[str, ...] = tuple(
    get_args(cls.model_fields["type"].annotation)[0] for cls in STEP_CLASSES
)
STEP_LABELS: dict[str, str] = {
    kind: cls.label for kind, cls in zip(STEP_TYPES, STEP_CLASSES, strict=True)
}


# Parameters -------------------------------------------------------------------------------------


# Launch values are bounded whatever the workflow says: a value becomes part of the run, its audit
# event and every export of the trail. A string parameter may lower or raise its own maximum up
# to the cap; the other types have a fixed one that any real value fits in.
STRING_MAX_LENGTH_DEFAULT = 1_000
STRING_MAX_LENGTH_CAP = 10_000
OTHER_MAX_LENGTH = 64
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


# The approval options that reach reviewers outside the page (chat, passkeys); a workflow keeps
# them together, beside its quorum and expiry.
APPROVAL_REACH_OPTIONS = ("slack_channel", "passkey", "passkey_above_amount")


class ApprovalPolicy(Strict):
    quorum: int = Field(default=1, ge=1, le=5)
    expiry_minutes: int = Field(default=60, ge=1, le=7 * 24 * 60)
    author_may_approve: bool = False
    # Hand-over: 0 turns each off. A reminder goes to the reviewers this many minutes before
    # the request expires; after ``escalate_after_minutes`` undecided, ``escalation_group`` is
    # told and may decide too.
    remind_before_minutes: int = Field(default=0, ge=0, le=7 * 24 * 60)
    escalate_after_minutes: int = Field(default=0, ge=0, le=7 * 24 * 60)
    escalation_group: str = Field(default="", max_length=150)

    # A Slack channel id (C0123ABCD) or name (#payments) where requests are posted as cards.
    slack_channel: str | None = Field(
        default=None, pattern=r"^([CGD][A-Z0-9]{6,20}|#?[a-z0-9][a-z0-9._-]{0,79})$"
    )
    # A fresh passkey assertion with every verdict: never, always, or when the request's amount
    # (the workflow's money parameter) is above ``passkey_above_amount``.
    passkey: Literal["never", "always", "above"] = "never"
    passkey_above_amount: Decimal | None = Field(default=None, ge=0, decimal_places=2)

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
        min_length=1, max_length=50
    )
    step_budget: int = Field(default=50, ge=1, le=1000)
    run_ttl_minutes: int = Field(default=15, ge=1, le=240)
    # Batch launches keep at most this many runs of the workflow holding a browser at once.
    max_concurrent_runs: int = Field(default=3, ge=1, le=50)
    approval: ApprovalPolicy = Field(default_factory=ApprovalPolicy)
    credentials: list[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]] = Field(
        default_factory=list
    )
    # A filmstrip of the run's browser (masked frames, low rate, bounded size) kept with its
    # evidence: off unless a workflow asks for it.
    filmstrip: bool = False
    filmstrip_seconds_per_frame: float = Field(default=2.0, ge=0.5, le=60.0)
    filmstrip_max_mb: int = Field(default=20, ge=1, le=500)

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


class Problem(BaseModel):
    """Something wrong with a document, located as precisely as we can."""

    path: tuple[str | int, ...]
    message: str

    def where(
        self, steps: list[Any] | None = None, *, session_steps: list[Any] | None = None
    ) -> str:
        path = self.path
        if path[:2] == ("session", "steps") and len(path) >= 3 and isinstance(path[2], int):
            return "session " + _step_where(path[2], path[3:], session_steps)
        if len(path) >= 2 and path[0] == "steps" and isinstance(path[1], int):
            return _step_where(path[1], path[2:], steps)
        return ".".join(str(p) for p in path) or "document"


def _step_where(index: int, rest: tuple[str | int, ...], steps: list[Any] | None) -> str:
    step_id = ""
    if steps is not None and index < len(steps):
        step_id = f" '{_step_id(steps[index])}'"
    field = ".".join(str(p) for p in rest)
    return f"step {index + 1}{step_id}" + (f", field {field}" if field else "")


def _step_id(step: Any) -> str:
    if isinstance(step, StepBase):
        return step.id
    if isinstance(step, dict):
        return str(step.get("id", "?"))
    return "?"


def references(text: str) -> list[tuple[str, str, str | None]]:
    """The ``{{ ns.name[.field] }}`` references in ``text`` as (namespace, name, field).

    Raises ValueError for a reference that does not parse.
    """
    found = []
    for match in TEMPLATE.finditer(text):
        ref = REFERENCE.match(match.group("ref"))
        if ref is None:
            raise ValueError(
                f"'{{{{ {match.group('ref')} }}}}' is not a reference; use {{{{ params.name }}}}, "
                "{{ secrets.credential.field }} or {{ outputs.name }}"
            )
        found.append((ref["ns"], ref["name"], ref["field"]))
    if "{{" in TEMPLATE.sub("", text) or "}}" in TEMPLATE.sub("", text):
        raise ValueError("unbalanced '{{' or '}}'")
    return found


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
    scope = _Scope(
        hosts=[parse_host_pattern(h) for h in document.settings.allowed_hosts],
        params=params,
        scoped=scoped,
        credential_kinds=credential_kinds,
    )
    if document.session is not None:
        problems += _session_problems(document.session, scope)
    problems += _steps_problems(document.steps, ("steps",), scope)
    return problems


@dataclasses.dataclass
class _Scope:
    """What the steps of one list may refer to, and what the lists seen so far declared."""

    hosts: list[Any]
    params: set[str]
    scoped: set[str]
    credential_kinds: dict[str, str] | None
    # Session steps run once for many runs: no parameters, no outputs of their own.
    session: bool = False
    step_ids: set[str] = dataclasses.field(default_factory=set)
    outputs: set[str] = dataclasses.field(default_factory=set)
    # Outputs that are one-time codes: typed into a field, never shown or compared.
    codes: set[str] = dataclasses.field(default_factory=set)
    # Step ids the session template declared, for a clearer message on a clash.
    session_ids: set[str] = dataclasses.field(default_factory=set)


def _session_problems(session: SessionSpec, scope: _Scope) -> list[Problem]:
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
    session_scope = _Scope(
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
        problem = _goto_problem(session.check_url, scope.hosts)
        if problem:
            problems.append(Problem(path=(*here, "check_url"), message=problem))
    return problems


def _steps_problems(
    steps: Sequence[StepBase], prefix: tuple[str | int, ...], scope: _Scope
) -> list[Problem]:
    problems: list[Problem] = []
    for index, step in enumerate(steps):
        here: tuple[str | int, ...] = (*prefix, index)
        problems += _common_problems(step, here, scope)
        kind_problems = _KIND_PROBLEMS.get(type(step))
        if kind_problems is not None:
            problems += kind_problems(step, here, scope)
    return problems


def _common_problems(step: StepBase, here: tuple[str | int, ...], scope: _Scope) -> list[Problem]:
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


def _goto_problems(step: GotoStep, here: tuple[str | int, ...], scope: _Scope) -> list[Problem]:
    problem = _goto_problem(step.url, scope.hosts)
    return [Problem(path=(*here, "url"), message=problem)] if problem else []


def _login_problems(step: LoginStep, here: tuple[str | int, ...], scope: _Scope) -> list[Problem]:
    problems = []
    if step.credential not in scope.scoped:
        problems.append(
            Problem(
                path=(*here, "credential"),
                message=f"credential '{step.credential}' is not among this workflow's "
                "credentials (settings → credentials)",
            )
        )
    kind = (scope.credential_kinds or {}).get(step.credential)
    if kind is not None and kind != "username_password":
        problems.append(
            Problem(
                path=(*here, "credential"),
                message=f"credential '{step.credential}' is a {kind}, "
                "login needs a username and password",
            )
        )
    return problems


def _assert_problems(step: AssertStep, here: tuple[str | int, ...], scope: _Scope) -> list[Problem]:
    problems = []
    for check_index, check in enumerate(step.checks):
        if isinstance(check, CompareCheck):
            for side in ("left", "right"):
                problem = _operand_problem(getattr(check, side), scope)
                if problem:
                    path = (*here, "checks", check_index, side)
                    problems.append(Problem(path=path, message=problem))
    return problems


def _extract_problems(
    step: ExtractStep, here: tuple[str | int, ...], scope: _Scope
) -> list[Problem]:
    problems = []
    for field_index, extract in enumerate(step.fields):
        if extract.name in scope.outputs:
            path = (*here, "fields", field_index, "name")
            problems.append(
                Problem(path=path, message=f"output '{extract.name}' is extracted twice")
            )
        scope.outputs.add(extract.name)
    return problems


def _named_file_problems(
    step: ScreenshotStep | DownloadStep, here: tuple[str | int, ...], scope: _Scope
) -> list[Problem]:
    problems = []
    if step.name in scope.outputs:
        problems.append(
            Problem(path=(*here, "name"), message=f"name '{step.name}' is already used")
        )
    scope.outputs.add(step.name)
    return problems


def _ask_problems(step: AskStep, here: tuple[str | int, ...], scope: _Scope) -> list[Problem]:
    problems = []
    if step.save_as in scope.outputs:
        problems.append(
            Problem(path=(*here, "save_as"), message=f"name '{step.save_as}' is already used")
        )
    scope.outputs.add(step.save_as)
    if step.answer == "code":
        scope.codes.add(step.save_as)
    if step.answered_by != ASK_LAUNCHER and not re.fullmatch(r"[\w .@+-]+", step.answered_by):
        problems.append(
            Problem(
                path=(*here, "answered_by"),
                message="answered_by is 'launcher' or the name of a group",
            )
        )
    return problems


# The problems only one step kind can have (every kind has the common ones).
_KIND_PROBLEMS: dict[
    type[StepBase], Callable[[Any, tuple[str | int, ...], _Scope], list[Problem]]
] = {
    GotoStep: _goto_problems,
    LoginStep: _login_problems,
    AssertStep: _assert_problems,
    ExtractStep: _extract_problems,
    ScreenshotStep: _named_file_problems,
    DownloadStep: _named_file_problems,
    AskStep: _ask_problems,
}


def _reference_problem(
    ns: str, name: str, sub: str | None, *, field: str, step: StepBase, scope: _Scope
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
        if name in scope.codes and not (isinstance(step, FillStep) and field == "value"):
            return (
                f"'{name}' is a one-time code: it may only be typed into a field (the value of "
                "a fill step), where it is masked"
            )
        return None
    # Secrets may only be typed into a field: anywhere else (a URL, a waited-for text) they would
    # end up in observations, events and screenshots.
    if not (isinstance(step, FillStep) and field == "value"):
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


def _operand_problem(operand: str, scope: _Scope) -> str | None:
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


def credentials_used(steps: list[Any]) -> set[str]:
    """The credentials ``steps`` (validated or raw) type: only these are decrypted for them."""
    names = set()
    for data in steps:
        step = data if isinstance(data, StepBase) else STEP_ADAPTER.validate_python(data)
        if isinstance(step, LoginStep):
            names.add(step.credential)
        for _, text in step.all_templates():
            names |= {name for ns, name, _ in references(text) if ns == "secrets"}
    return names


def _goto_problem(url: str, hosts: list[Any]) -> str | None:
    # Parameters may fill the path and query, never the scheme or host: the allowlist has to be
    # checkable before the run starts.
    head = url.split("/", 3)
    authority = "/".join(head[:3])
    if "{{" in authority:
        return "parameters may only be used in the path and query of a URL, not in its host"
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"}:
        return "the URL must start with http:// or https://"
    if not parts.hostname:
        return "the URL has no host"
    try:
        port = parts.port
    except ValueError:
        return "the URL's port is not a number"
    if parts.username or parts.password:
        return "put credentials in a credential, not in the URL"
    effective_port = port or (443 if parts.scheme == "https" else 80)
    if not host_allowed(parts.hostname, effective_port, hosts):
        return (
            f"{parts.hostname}{':' + str(port) if port else ''} is not in the allowed hosts "
            f"({', '.join(str(h) for h in hosts)})"
        )
    return None


def irreversible_warnings(steps: list[StepBase]) -> list[Problem]:
    """Steps that look like they do something final but are not marked irreversible."""
    warnings = []
    for index, step in enumerate(steps):
        if step.irreversible or not isinstance(step, ClickStep | PressStep):
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


def ask_audience(answered_by: str) -> str:
    """Who an ask step waits for, in words."""
    return "the person who launched the run" if answered_by == ASK_LAUNCHER else answered_by


def one_time_code(text: str) -> str:
    """A one-time code as typed into the portal: spaces and dashes people copy along removed.
    Raises ValueError, in the answerer's words, for anything that is not a code."""
    code = re.sub(r"[\s-]", "", text)
    if not ONE_TIME_CODE.fullmatch(code):
        raise ValueError("a code is 3 to 12 letters or digits")
    return code


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


def _check_sentence(check: Any) -> str:
    if isinstance(check, TextCheck):
        verb = "shows" if check.kind == "text_present" else "does not show"
        return f"the page {verb} '{check.text}'"
    if isinstance(check, UrlCheck):
        return f"the address matches {check.pattern}"
    if isinstance(check, CountCheck):
        return f"the number of {check.target.describe()} {check.op} {check.count}"
    return f"{check.left} {check.op} {check.right}"
