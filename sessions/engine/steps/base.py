"""What every step kind's module works with: the runner's side of acting on the page
(``Acting``), the record a step leaves, and how a step fails."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from playwright.sync_api import Download, Locator, Page

from sessions.engine import observation as observing
from workflows.schema import ExtractField, SelectStep, Target, WaitForStep


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
    status: Literal["succeeded", "failed", "blocked"]
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
    def choose(self, page: Page, step: SelectStep, timeout: float) -> None: ...
    def wait_for(self, page: Page, step: WaitForStep, timeout: float) -> None: ...
    def extract_field(self, page: Page, extract: ExtractField, timeout: float) -> Any: ...
    def check_outcome(self, page: Page, check: Any) -> str | None: ...
    def masks(self, page: Page) -> list[Locator]: ...
    def save_file(self, name: str, filename: str, content: bytes) -> ArtifactFile: ...
    def save_download(self, name: str, download: Download) -> ArtifactFile: ...


# How a step kind acts: (the runner, the step, its record, the timeout in milliseconds).
Act = Callable[[Acting, Any, StepRecord, float], None]
