"""The words every step is written in: targets, expected outcomes and ``{{ … }}`` references
(no Django, no browser: the dashboard validates with them)."""

from __future__ import annotations

import fnmatch
import re
import shlex
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

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


def url_matches(url: str, pattern: str) -> bool:
    """Playwright-style globs: ** crosses slashes; fnmatch's * already does, so both map to it."""
    return fnmatch.fnmatchcase(url, pattern.replace("**", "*"))
