"""What every step kind's module works with: the step model's base and the problems it reports
(read by the dashboard, so nothing here loads the browser), the runner's side of acting on the
page (``Acting``), the record a step leaves, and how a step fails."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, get_args
from urllib.parse import urlsplit

from pydantic import BaseModel, Field

from sessions.engine.steps.language import STEP_ID, Expect, Strict, Target, references
from workflows.hosts import host_allowed

if TYPE_CHECKING:
    from playwright.sync_api import Download, Locator, Page

    from sessions.engine import observation as observing


class StepBase(Strict):
    # What the editor's palette calls the kind, and whether a session template may use it (to
    # get to a logged-in page; reading values, saving files and asking belong to the run).
    if TYPE_CHECKING:
        # Each kind declares its own ``type: Literal[...]`` (the union's discriminator).
        type: str

    label: ClassVar[str]
    in_session: ClassVar[bool] = True
    # The editor's fields for the kind (``workflows.forms.StepForm``'s names), in their order.
    editor_fields: ClassVar[tuple[str, ...]]
    # The fields a secret or a one-time code may be typed from: anywhere else they would end up
    # in observations, events and screenshots.
    secret_fields: ClassVar[tuple[str, ...]] = ()
    # Whether the step sends the page input (a read-only step can reuse the evidence before it).
    touches_page: ClassVar[bool] = True
    # Whether the step may be marked irreversible (and so wait for an approval and an outcome).
    can_be_irreversible: ClassVar[bool] = True
    # Whether a target that reads like "Pay" or "Delete" on a step not marked irreversible is
    # worth a warning (the kinds that act on what the target names).
    warns_on_final_words: ClassVar[bool] = False

    id: str = Field(pattern=STEP_ID, description="unique within the workflow, e.g. open-login")
    description: str = Field(default="", max_length=500)
    irreversible: bool = False
    timeout_ms: int = Field(default=10_000, ge=100, le=300_000)
    # Required (at publish) on irreversible steps: what the portal shows when the action worked.
    expect: Expect | None = None

    def targets(self) -> list[Target]:
        return [v for v in self.__dict__.values() if isinstance(v, Target)]

    @classmethod
    def target_fields(cls) -> tuple[str, ...]:
        """The fields that name an element of the page (a login's three, a click's one)."""
        return tuple(
            name
            for name, info in cls.model_fields.items()
            if info.annotation is Target or Target in get_args(info.annotation)
        )

    def templates(self) -> list[tuple[str, str]]:
        """(field, text) pairs whose text may contain ``{{ … }}`` references."""
        return []

    def all_templates(self) -> list[tuple[str, str]]:
        """:meth:`templates` and those of the expected outcome."""
        return self.templates() + (self.expect.templates() if self.expect else [])

    def sentence(self) -> str:
        """What the step does, in one sentence a person reads (each kind says its own)."""
        return self.id

    def problems(self, here: tuple[str | int, ...], scope: StepScope) -> list[Problem]:
        """What only this kind can get wrong in a document (every kind has the common ones);
        ``scope`` also collects what the step declares for the steps after it."""
        return []

    def credentials(self) -> set[str]:
        """The credentials the step types: only these are decrypted for it."""
        return {
            name
            for _, text in self.all_templates()
            for ns, name, _ in references(text)
            if ns == "secrets"
        }


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


@dataclasses.dataclass
class StepScope:
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

    def declare_output(self, name: str, path: tuple[str | int, ...]) -> list[Problem]:
        """A step names an output (a value, a file): later steps may use it, once."""
        taken = name in self.outputs
        self.outputs.add(name)
        return [Problem(path=path, message=f"name '{name}' is already used")] if taken else []


def url_problem(url: str, hosts: list[Any]) -> str | None:
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


class StepFailed(Exception):
    """A step could not do what it says; the message is for people."""


class Refused(StepFailed):
    """The portal said no, in the words it showed (or the HTTP status it answered)."""


@dataclass(frozen=True)
class ArtifactFile:
    name: str
    filename: str
    path: Path
    sha256: str
    size: int


@dataclass
class StepRecord:
    index: int
    step_id: str
    step_type: str
    sentence: str
    status: Literal["succeeded", "failed", "blocked", "skipped"]
    started_at: datetime
    duration_ms: int
    url: str = ""
    title: str = ""
    error: str = ""
    observation: dict[str, Any] | None = None
    observation_chars: int = 0
    observation_tokens: int = 0
    screenshot: bytes | None = None  # JPEG
    # What the numbered overlay is drawn from; the sink draws it (and the thumbnail) off the
    # runner's path, since the browser does not need to wait for Pillow.
    elements: tuple[observing.Element, ...] = ()
    # What the page showed, not yet built into ``observation`` and ``elements``: the writer does
    # that (``sessions.engine.recording.finish``), off the runner's path.
    pending: observing.Snapshot | None = None
    outputs: dict[str, Any] = field(default_factory=dict)
    artifacts: list[ArtifactFile] = field(default_factory=list)


class Plan(Protocol):
    @property
    def deadline(self) -> float: ...
    @property
    def secrets(self) -> dict[str, dict[str, str]]: ...
    @property
    def inputs(self) -> dict[str, Any]: ...


class Acting(Protocol):
    """What a step kind may use of the runner that executes it."""

    @property
    def page(self) -> Page: ...
    @property
    def plan(self) -> Plan: ...

    outputs: dict[str, Any]
    # What fill steps typed, for the approval's evidence (secrets masked).
    filled: list[dict[str, Any]]
    # Outputs that hold one-time codes: masked like secrets.
    code_names: set[str]

    def text(self, template: str, *, secrets: bool = False) -> str: ...
    def words(self, text: str) -> str: ...
    def locate(self, scope: Page | Locator, target: Target, *, strict: bool = True) -> Locator: ...
    def settle(self, page: Page) -> None: ...
    def new_refusals(self) -> list[str]:
        """Refusals the portal shows that it did not show before this step began."""
        ...

    def masks(self, page: Page) -> list[Locator]: ...
    def save_file(self, name: str, filename: str, content: bytes) -> ArtifactFile: ...
    def save_download(self, name: str, download: Download) -> ArtifactFile: ...


# How a step kind acts: (the runner, the step, its record, the timeout in milliseconds).
Act = Callable[[Acting, Any, StepRecord, float], None]


@dataclass(frozen=True)
class StepKind:
    """A step kind as the registry holds it: its model, and how it acts on the page (None for a
    kind the runner handles itself, such as ``ask``, which pauses the run)."""

    model: type[StepBase]
    act: Act | None
