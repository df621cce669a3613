"""What a run is given and what it gives back: the plan (steps, values, secrets, limits), the
gate and question it stops at, its outcome, and what the runner expects of its sink and pause."""

from __future__ import annotations

import base64
import hashlib
import hmac
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from sessions.engine.pictures import outline_target
from sessions.engine.steps.base import StepRecord
from sessions.engine.steps.fill import FillStep
from sessions.engine.steps.language import references
from sessions.engine.steps.login import LoginStep
from sessions.engine.vocabulary import PUBLIC_CREDENTIAL_FIELDS
from workflows.schema import STEP_ADAPTER, FactSource


@dataclass(frozen=True)
class SessionCheck:
    """How to tell a logged-in browser: ``logged_in`` (a Target, as data) shows at ``url``."""

    url: str
    logged_in: dict[str, Any]


@dataclass(frozen=True)
class Answer:
    """A person's answer to the ``ask`` step at ``index`` (a code in clear, in memory only)."""

    index: int
    value: str
    answerer: str


@dataclass(frozen=True)
class RunPlan:
    steps: list[dict[str, Any]]
    inputs: dict[str, Any]
    # credential name → its decrypted fields; only ever held in memory by the runner.
    secrets: dict[str, dict[str, str]]
    step_budget: int
    deadline: float  # time.time() after which the run has expired
    artifacts_dir: Path
    start_index: int = 0
    outputs: dict[str, Any] = field(default_factory=dict)
    # The irreversible step a person approved, and the evidence they looked at: the runner
    # re-observes the page and acts only if it still matches.
    approved_index: int | None = None
    approved_evidence: dict[str, Any] | None = None
    # Multiplies every wait: a browser under software emulation is 10-60x slower.
    time_scale: float = 1.0
    # With a session template. A fork checks ``session`` before its first step, after loading
    # ``storage_state`` (None when the sandbox woke up from a saved VM, already logged in). A bake
    # (``baking``) checks it after its steps, which log in, and returns the storage state when
    # ``capture_state``.
    session: SessionCheck | None = None
    storage_state: dict[str, Any] | None = None
    baking: bool = False
    capture_state: bool = False
    # The answer to the ask step the run waited at: the run goes on from that step.
    answer: Answer | None = None
    # A scratch session's rehearsal of a draft: steps up to ``stop_index`` (exclusive), with
    # every irreversible step and every question to a person recorded as skipped, never done.
    rehearsal: bool = False
    stop_index: int | None = None
    # In a rehearsal, more steps to record as skipped: step id → why, in words.
    skip: dict[str, str] = field(default_factory=dict)
    # The facts a reviewer decides on (amount, payee, reference): read into every gate's
    # evidence and compared with the page.
    facts: tuple[FactSource, ...] = ()


Status = Literal[
    "succeeded",
    "failed",
    "approval_required",
    "answer_required",
    "cancelled",
    "expired",
    # An irreversible action was started and did not finish cleanly: it may have happened.
    "action_uncertain",
]


@dataclass(frozen=True)
class Gate:
    """What a reviewer needs to decide on an irreversible step, taken just before it."""

    evidence: dict[str, Any]
    screenshot: bytes  # PNG, masked
    # The same picture with the target outlined: what the reviewer is shown first.
    outlined: bytes
    # Set when the page no longer matched the evidence of an earlier approval.
    changes: tuple[str, ...] = ()

    @classmethod
    def of(cls, evidence: dict[str, Any], screenshot: bytes, changes: tuple[str, ...] = ()) -> Gate:
        box = (evidence.get("target") or {}).get("box")
        outlined = (
            outline_target(screenshot, (box["x"], box["y"], box["width"], box["height"]))
            if box
            else screenshot
        )
        return cls(evidence=evidence, screenshot=screenshot, outlined=outlined, changes=changes)


@dataclass(frozen=True)
class Question:
    """What an ask step asks, its references filled in (secrets masked), and who may answer."""

    step_index: int
    step_id: str
    text: str
    answer: Literal["text", "code", "choice"]
    options: tuple[str, ...]
    save_as: str
    answered_by: str
    timeout_minutes: int


@dataclass(frozen=True)
class RunOutcome:
    status: Status
    reason: str = ""
    failed_step: str = ""
    next_index: int = 0
    outputs: dict[str, Any] = field(default_factory=dict)
    steps_executed: int = 0
    gate: Gate | None = None
    question: Question | None = None
    # A fork that woke up logged out: what the check saw (the reason is STALE_SESSION).
    session_stale: str = ""
    # A bake's capture: cookies and local storage, as secret as the password that made them.
    storage_state: dict[str, Any] | None = None


@dataclass(frozen=True)
class HandBack:
    """What a person did while they had control of the browser between two steps."""

    by: str
    inputs: int
    navigated: bool
    typed: bool
    urls: tuple[str, ...] = ()
    # The dialogs the page opened meanwhile and what became of them, in words.
    dialogs: tuple[str, ...] = ()


class Pause(Protocol):
    def hold(self, index: int, stop: Callable[[], str | None], deadline: float) -> HandBack | None:
        """Called before step ``index``: block while a person has control of the browser and
        return what they did, or None at once when nobody asked for control. Returns early
        when ``stop`` gives a reason or at ``deadline`` (the run's time limit, epoch
        seconds)."""
        ...


class RunSink(Protocol):
    def step_finished(self, record: StepRecord) -> None: ...

    def action_starting(self, index: int) -> None:
        """Durably record the intent to perform the approved action; raise to forbid it."""
        ...

    def action_finished(self, index: int, result: str = "") -> None:
        """Durably record that the approved action completed (``result``: how the portal
        showed it, and what a dialog it opened said)."""
        ...

    def action_refused(self, index: int, reason: str) -> None:
        """Durably record that the portal refused the approved action: it was not done."""
        ...

    def stop_reason(self) -> str | None:
        """A reason to stop before the next step (the run was cancelled), or None."""


def secret_values_of(secrets: dict[str, dict[str, str]]) -> list[str]:
    """The values masked everywhere (longest first): every credential field but a username."""
    return sorted(
        {
            value
            for fields in secrets.values()
            for name, value in fields.items()
            if value and name not in PUBLIC_CREDENTIAL_FIELDS
        },
        key=len,
        reverse=True,
    )


def secret_targets(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fields a workflow types secrets into (a login's password, a fill of a secret), as
    target data: nobody but the runner types there, and nobody sees what they hold."""
    targets: list[dict[str, Any]] = []
    for data in steps:
        step = STEP_ADAPTER.validate_python(data)
        if isinstance(step, LoginStep):
            targets.append(step.password.model_dump(exclude_defaults=True))
        elif isinstance(step, FillStep) and any(
            namespace == "secrets" and sub not in PUBLIC_CREDENTIAL_FIELDS
            for namespace, _, sub in references(step.value)
        ):
            targets.append(step.target.model_dump(exclude_defaults=True))
    return targets


def totp_code(seed: str, *, at: float | None = None, digits: int = 6, period: int = 30) -> str:
    """RFC 6238 code for a base32 seed (SHA-1, the portals' default)."""
    key = base64.b32decode(seed.upper() + "=" * (-len(seed) % 8))
    counter = int((time.time() if at is None else at) // period)
    digest = hmac.new(key, struct.pack(">Q", counter), hashlib.sha1).digest()
    offset = digest[-1] & 0x0F
    number = struct.unpack(">I", digest[offset : offset + 4])[0] & 0x7FFFFFFF
    return str(number % 10**digits).zfill(digits)
