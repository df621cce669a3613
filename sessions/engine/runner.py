"""The step runner: drives a sandboxed browser over CDP through a published workflow (no Django).

For every step it acts, then observes the page, screenshots it (secret fields masked), times it,
and hands a :class:`StepRecord` to the caller's sink, which persists and publishes it. The page
observed after one step is what the next step acts on, so each record carries the "after" view
and the previous record the "before" view.

Secrets are substituted at the last moment and typed by code. They never appear in a record:
sentences say "a secret", observations and screenshots are masked, error texts are scrubbed.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import re
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from playwright.sync_api import Browser, BrowserContext, Download, Locator, Page
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from sessions.engine import observation as observing
from sessions.engine import steps
from sessions.engine.driver import Connection, connect_timeout_ms, with_browser
from sessions.engine.outcomes import (
    FailedResponse,
    ResponseWatch,
    visible_refusals,
)
from sessions.engine.pictures import outline_target
from sessions.engine.steps.ask import AskStep, ask_audience
from sessions.engine.steps.assertion import AssertStep
from sessions.engine.steps.base import (
    ArtifactFile,
    Refused,
    StepBase,
    StepFailed,
    StepRecord,
)
from sessions.engine.steps.click import ClickStep
from sessions.engine.steps.extract import ExtractStep
from sessions.engine.steps.fill import FillStep
from sessions.engine.steps.goto import GotoStep
from sessions.engine.steps.language import Expect, Target, references, url_matches
from sessions.engine.steps.login import LoginStep
from sessions.engine.steps.screenshot import ScreenshotStep
from sessions.engine.steps.wait import WaitStep
from sessions.engine.steps.wait_for import WaitForStep
from sessions.engine.vocabulary import MASK, PUBLIC_CREDENTIAL_FIELDS, STALE_SESSION
from workflows.schema import STEP_ADAPTER, describe_step

SCREENSHOT_QUALITY = 85
PAGE_TEXT_LIMIT = 10_000
# Who the target of a gated action is, beyond its accessible name: compared before acting.
_TARGET_IDENTITY = """e => ({
  tag: e.tagName.toLowerCase(),
  id: e.id || '',
  name: e.getAttribute('name') || '',
  type: e.getAttribute('type') || '',
  text: (e.innerText || e.value || '').trim().slice(0, 200),
  form_action: e.form ? (e.form.getAttribute('action') || '') : '',
})"""
# A reference in a workflow's text, as people wrote it: ``{{ params.invoice }}``.
_REFERENCE = re.compile(
    r"\{\{\s*(params|secrets|outputs)\.([a-z][a-z0-9_-]*)(?:\.([a-z_]+))?\s*\}\}"
)
# What covers the middle of an element: the nearest dialog (or named region) around what is
# there, a dialog inside it (a backdrop holding a modal), else the element itself. Described the
# way people see it: a role and a name, heading or label.
_COVERED_BY = r"""(e, point) => {
  let x, y, root;
  if (point) { [x, y] = point; root = document; } else {
    const r = e.getBoundingClientRect();
    x = r.left + r.width / 2; y = r.top + r.height / 2;
    root = e.getRootNode && e.getRootNode().elementFromPoint ? e.getRootNode() : e.ownerDocument;
  }
  const hit = root.elementFromPoint(x, y);
  if (!hit) return null;
  if (point) { if (hit.tagName === 'IFRAME' || hit.tagName === 'FRAME') return null; }
  else if (hit === e || e.contains(hit) || hit.contains(e)) return null;
  const words = t => (t || '').replace(/\s+/g, ' ').trim();
  const firstLine = el => words((el.innerText || el.textContent || '').split('\n').find(
    l => l.trim()) || '');
  const nameOf = el => {
    const label = words(el.getAttribute('aria-label'));
    if (label) return label;
    const ids = words(el.getAttribute('aria-labelledby'));
    if (ids) {
      const doc = el.ownerDocument;
      const text = words(ids.split(' ').map(id => {
        const n = doc.getElementById(id); return n ? n.textContent : '';
      }).join(' '));
      if (text) return text;
    }
    const heading = el.querySelector('h1,h2,h3,h4,h5,h6,[role=heading],legend');
    if (heading && words(heading.textContent)) return words(heading.textContent);
    return firstLine(el);
  };
  const dialog = el => {
    const role = el.getAttribute('role');
    if (role === 'alertdialog') return 'alert dialog';
    if (role === 'dialog' || el.getAttribute('aria-modal') === 'true') return 'dialog';
    if (el.tagName === 'DIALOG') return 'dialog';
    return '';
  };
  const REGIONS = ['region', 'banner', 'complementary', 'contentinfo', 'navigation', 'alert',
    'status', 'form', 'menu', 'listbox', 'tooltip'];
  for (let el = hit; el; el = el.parentElement || (el.getRootNode().host || null)) {
    if (dialog(el)) return {kind: dialog(el), name: nameOf(el)};
    const role = el.getAttribute('role');
    if (REGIONS.includes(role) && (el.getAttribute('aria-label') ||
        el.getAttribute('aria-labelledby'))) return {kind: role, name: nameOf(el)};
  }
  const inner = hit.querySelector(
    '[role=dialog],[role=alertdialog],[aria-modal=true],dialog[open]');
  if (inner) return {kind: dialog(inner) || 'dialog', name: nameOf(inner)};
  const TAGS = {A: 'link', BUTTON: 'button', IMG: 'image', INPUT: 'field', SELECT: 'dropdown',
    TEXTAREA: 'field', HEADER: 'banner', FOOTER: 'footer', ASIDE: 'panel', NAV: 'navigation',
    IFRAME: 'frame'};
  const kind = hit.getAttribute('role') || TAGS[hit.tagName] || 'element';
  let name = nameOf(hit);
  if (!name && kind === 'element') {
    const cls = words(hit.getAttribute('class')).split(' ')[0];
    name = '<' + hit.tagName.toLowerCase() + (hit.id ? '#' + hit.id : cls ? '.' + cls : '') + '>';
  }
  return {kind, name};
}"""
# The words of an error page: its main heading and the paragraph that follows it.
_ERROR_PAGE_WORDS = """() => {
  const h = document.querySelector('main h1, h1');
  if (!h) return '';
  const clean = t => (t || '').replace(/\\s+/g, ' ').trim();
  let next = h.nextElementSibling;
  while (next && !clean(next.innerText)) next = next.nextElementSibling;
  const words = [clean(h.innerText), next ? clean(next.innerText) : ''];
  return words.filter(Boolean).join(': ').slice(0, 400);
}"""
# Steps that look at the page without sending it any input.
READ_ONLY_STEPS = (WaitForStep, WaitStep, ExtractStep, AssertStep, ScreenshotStep)
READ_ONLY_TYPES = frozenset({"wait_for", "wait", "extract", "assert", "screenshot"})
# The whole reason a forked run gives when it woke up logged out; people act on these words.
# A blank page served in place of an origin while its local storage is restored: nothing of the
# restore reaches the portal.
_BLANK = "<!doctype html><title>restoring</title>"


class Unconfirmed(StepFailed):
    """An irreversible action was performed and the portal showed neither its expected outcome
    nor a refusal: it may or may not have happened."""


# Why an approved action that did not end in its outcome or a refusal may have happened, by how
# its step ended.
_UNCERTAIN = {
    "unconfirmed": "the approved action was performed but the portal did not confirm it",
    "unanswered": "the approved action was sent and its outcome is unknown",
}


class Unanswered(StepFailed):
    """The step's submission got no answer from the portal (the connection closed, the egress
    proxy answered for it, the browser gave up) or a server error: it may or may not have been
    done, and the portal did not say no."""


@dataclass(frozen=True)
class _Seen:
    """The evidence of the last step, and the page's change mark when it was taken."""

    page: Page
    mark: str | None
    taken: observing.Snapshot
    screenshot: bytes | None


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


class Runner:
    def __init__(self, plan: RunPlan, sink: RunSink, pause: Pause | None = None) -> None:
        self.plan = plan
        self.sink = sink
        self.pause = pause
        # Who had control of the browser during this run, and what they did: shown with the
        # next irreversible step's evidence.
        self._operators: list[dict[str, Any]] = []
        self.outputs: dict[str, Any] = dict(plan.outputs)
        # What is masked everywhere: passwords, seeds, tokens (and the codes made from seeds, as
        # they are typed). A username is no secret: people need to see who the robot logged in as.
        self.secret_values = secret_values_of(plan.secrets)
        self._pages: list[Page] = []
        self._notes: list[str] = []
        # What this run typed into which field (secrets masked), for the approval evidence.
        self.filled: list[dict[str, Any]] = list((plan.approved_evidence or {}).get("filled", []))
        # The last step's evidence, to reuse when a read-only step finds the page unchanged.
        self._last_capture: _Seen | None = None
        self._watches: dict[int, observing.PageWatch] = {}
        # The refusal messages visible when the last step ended: only a new one is a step's.
        self._known_refusals: set[str] | None = None
        # What the current step does with a dialog it opens, and the dialogs it saw.
        self._dialog_plan: ClickStep | None = None
        self._dialogs: list[dict[str, str]] = []
        self._unexpected_dialogs: list[str] = []
        self._control_dialogs = False
        # How the current step ended when it did not simply succeed or fail.
        self._verdict: Literal["", "refused", "unconfirmed", "unanswered"] = ""
        self._baseline: set[str] = set()
        # One-time codes people answered, by output name: typed into fields, masked everywhere,
        # and gone with this runner (never in ``outputs``, which are stored).
        self._codes: dict[str, str] = {}
        self.code_names = {
            step["save_as"]
            for step in plan.steps
            if step.get("type") == "ask" and step.get("answer") == "code"
        }

    # The loop ------------------------------------------------------------------------------

    def run(self, cdp_url: str, *, artifacts_dir: str | None = None) -> RunOutcome:
        return with_browser(
            cdp_url,
            self._run,
            artifacts_dir=artifacts_dir,
            timeout_ms=connect_timeout_ms(self.plan.time_scale),
        )

    def run_on(self, connection: Connection) -> RunOutcome:
        """``run`` on a connection opened ahead of time."""
        return connection.run(self._run)

    def _run(self, browser: Browser) -> RunOutcome:
        context = browser.contexts[0] if browser.contexts else browser.new_context()
        fresh = self.plan.start_index == 0 and self.plan.approved_index is None
        if fresh and self.plan.storage_state:
            _load_storage_state(context, self.plan.storage_state)
        self._watch(context)
        if fresh and self.plan.session is not None and not self.plan.baking:
            try:
                seen = self._logged_out(self.plan.session)
            except StepFailed as exc:
                return self._outcome("failed", self._scrub(str(exc)), 0, 0)
            if seen:
                return RunOutcome(status="failed", reason=STALE_SESSION, session_stale=seen)
        outcome = self._steps(context)
        if outcome.status != "succeeded" or not self.plan.baking or self.plan.session is None:
            return outcome
        try:
            seen = self._logged_out(self.plan.session)
        except StepFailed as exc:
            return self._outcome("failed", self._scrub(str(exc)), outcome.next_index, 0)
        if seen:
            return self._outcome(
                "failed",
                self._scrub(
                    f"after the session steps {seen}: the login did not work, or the logged-in "
                    "check looks for the wrong element"
                ),
                outcome.next_index,
                outcome.steps_executed,
            )
        if not self.plan.capture_state:
            return outcome
        return replace(outcome, storage_state=dict(context.storage_state()))

    def _logged_out(self, check: SessionCheck) -> str:
        """What the page at ``check.url`` showed instead of the logged-in element ('' when it
        is there). Raises StepFailed when the page cannot be opened: a portal that does not
        answer says nothing about the session."""
        page = self.page
        target = Target.model_validate(check.logged_in)
        try:
            response = page.goto(check.url, wait_until="load", timeout=self._scaled(15_000))
        except PlaywrightError as exc:
            raise StepFailed(
                f"the logged-in check could not open {check.url}: {_first_line(str(exc))}"
            ) from None
        if response is not None and response.status >= 500:
            raise StepFailed(f"the logged-in check: {page.url} answered HTTP {response.status}")
        try:
            self.locate(page, target, strict=False).first.wait_for(
                state="visible", timeout=self._scaled(5_000)
            )
        except PlaywrightTimeout:
            return f"{check.url} showed no {_noun(target)} (the browser was at {page.url})"
        return ""

    def _steps(self, context: BrowserContext) -> RunOutcome:
        executed = 0
        index = self.plan.start_index
        for index in range(self.plan.start_index, len(self.plan.steps)):
            step = STEP_ADAPTER.validate_python(self.plan.steps[index])
            assert isinstance(step, StepBase)
            stop = self.sink.stop_reason()
            if stop:
                return self._outcome("cancelled", stop, index, executed)
            if self.pause is not None:
                handed = self.pause.hold(index, self.sink.stop_reason, self.plan.deadline)
                if handed is not None:
                    self._handed_back(handed)
                stop = self.sink.stop_reason()
                if stop:
                    return self._outcome("cancelled", stop, index, executed)
            if time.time() >= self.plan.deadline:
                return self._outcome(
                    "expired", "the run's time limit was reached", index, executed, step
                )
            if executed >= self.plan.step_budget:
                return self._outcome(
                    "failed",
                    f"the step budget of {self.plan.step_budget} steps was reached",
                    index,
                    executed,
                    step,
                )
            if isinstance(step, AskStep):
                answer = self.plan.answer
                if answer is None or answer.index != index:
                    question = self._question(index, step)
                    return self._outcome(
                        "answer_required",
                        f"step {index + 1} waits for {ask_audience(step.answered_by)} to answer: "
                        f"{question.text}",
                        index, executed, step, question=question,
                    )  # fmt: skip
                record = self._answered(index, step, answer)
                executed += 1
                self.sink.step_finished(record)
                continue
            if step.irreversible:
                try:
                    gate = self._gate(index, step)
                except (StepFailed, PlaywrightError) as exc:
                    reason = self.words(_first_line(str(exc)))
                    return self._outcome(
                        "failed",
                        f"could not gather the approval evidence for step {index + 1}: {reason}",
                        index,
                        executed,
                        step,
                    )
                if gate is not None:
                    return self._outcome(
                        "approval_required", gate_reason(index, step, gate), index, executed,
                        step, gate=gate,
                    )  # fmt: skip
                # Approved, and the page is as the reviewers saw it. The intent is on record
                # before the click and the completion after it: a crash in between is never
                # retried, a person reconciles it.
                self.sink.action_starting(index)
                record = self._execute(context, index, step)
                executed += 1
                if record.status == "failed" and self._verdict == "refused":
                    # The portal said no: nothing happened, so nothing to reconcile, and
                    # nothing is retried either.
                    self.sink.action_refused(index, record.error)
                    self.sink.step_finished(record)
                    return self._outcome("failed", record.error, index, executed, step)
                if record.status == "failed":
                    self.sink.step_finished(record)
                    why = _UNCERTAIN.get(
                        self._verdict, "the approved action failed half way and may have happened"
                    )
                    return self._outcome(
                        "action_uncertain", f"{why}: {record.error}", index, executed, step
                    )
                self.sink.action_finished(index, self._action_result(step))
                self.sink.step_finished(record)
                continue
            record = self._execute(context, index, step)
            executed += 1
            self.sink.step_finished(record)
            if record.status == "failed" and time.time() >= self.plan.deadline:
                # The step ran out of time because the run did: that is the reason to report.
                return self._outcome(
                    "expired", "the run's time limit was reached", index, executed, step
                )
            if record.status == "failed":
                return self._outcome("failed", record.error, index, executed, step)
        return self._outcome("succeeded", "", len(self.plan.steps), executed)

    def _handed_back(self, handed: HandBack) -> None:
        """A person had the browser: nothing seen before is known to hold now. The next step
        observes afresh, and an approval given before the take-over no longer covers its
        action (the person may have changed what the reviewers saw)."""
        self._last_capture = None
        self._known_refusals = None
        self._watches.clear()
        self._drain_control_dialogs()
        operator: dict[str, Any] = {
            "by": handed.by,
            "inputs": handed.inputs,
            "navigated": handed.navigated,
            "typed": handed.typed,
            "urls": [self._scrub(url) for url in handed.urls],
        }
        if handed.dialogs:
            operator["dialogs"] = [self._scrub(words) for words in handed.dialogs]
        self._operators.append(operator)
        if handed.inputs:
            self.plan = replace(self.plan, approved_index=None)

    def _outcome(
        self,
        status: Status,
        reason: str,
        index: int,
        executed: int,
        step: StepBase | None = None,
        *,
        gate: Gate | None = None,
        question: Question | None = None,
    ) -> RunOutcome:
        return RunOutcome(
            status=status,
            reason=reason,
            failed_step=step.id if step is not None and status != "succeeded" else "",
            next_index=index,
            outputs=dict(self.outputs),
            steps_executed=executed,
            gate=gate,
            question=question,
        )

    # Asking a person -------------------------------------------------------------------------

    def _question(self, index: int, step: AskStep) -> Question:
        return Question(
            step_index=index,
            step_id=step.id,
            text=self.words(step.question),
            answer=step.answer,
            options=tuple(step.options),
            save_as=step.save_as,
            answered_by=step.answered_by,
            timeout_minutes=step.timeout_minutes,
        )

    def _answered(self, index: int, step: AskStep, answer: Answer) -> StepRecord:
        """The ask step's record, once answered: the answer becomes an output (a code only in
        this runner's memory, masked from now on)."""
        clock = time.monotonic()
        record = StepRecord(
            index=index,
            step_id=step.id,
            step_type=step.type,
            sentence=self.words(f"{describe_step(step)} — answered by {answer.answerer}"),
            status="succeeded",
            started_at=datetime.now(UTC),
            duration_ms=0,
        )
        if step.answer == "code":
            self._codes[step.save_as] = self._secret(answer.value)
        else:
            self.outputs[step.save_as] = answer.value
            record.outputs[step.save_as] = answer.value
        self._capture(record, touched_page=False)
        record.duration_ms = int((time.monotonic() - clock) * 1000)
        return record

    # The approval gate -----------------------------------------------------------------------

    def _gate(self, index: int, step: StepBase) -> Gate | None:
        """The gate in front of irreversible step ``index``, or None when it may act now: it was
        approved and the page still shows what the reviewers saw."""
        approved = self.plan.approved_evidence
        if index != self.plan.approved_index or approved is None:
            evidence, screenshot = self._evidence(index, step)
            return Gate.of(evidence, screenshot)
        # Everything evidence_changes compares, read without the pictures and the observation:
        # those are for a new request only, and the reviewer is waiting for the action.
        current = self._compared(step, waiting=False)
        if current is not None and not evidence_changes(approved, current):
            return None
        evidence, screenshot = self._evidence(index, step)
        changes = evidence_changes(approved, evidence)
        if changes:
            return Gate.of(evidence, screenshot, tuple(changes))
        return None

    def _compared(self, step: StepBase, *, waiting: bool) -> dict[str, Any] | None:
        """The evidence that decides whether an approval still holds: the address, the target's
        identity, the values this run typed that are still on the page, the page's text.

        ``waiting=False`` reads what is there now and returns None when the target does not
        match exactly one element (the full evidence then waits, or says why it cannot)."""
        page = self.page
        page.wait_for_load_state("domcontentloaded", timeout=self._scaled(5_000))
        target: dict[str, Any] | None = None
        targets = step.targets()
        if targets:
            located = self.locate(page, targets[0])
            # One round trip for every match: a strict locator's evaluate first waits for its
            # element through several more.
            found = located.evaluate_all(f"elements => elements.map({_TARGET_IDENTITY})")
            if len(found) == 1:
                identity = found[0]
            elif waiting:
                identity = located.evaluate(_TARGET_IDENTITY, timeout=self._scaled(5_000))
            else:
                return None
            target = {
                "description": self.words(targets[0].describe()),
                **{key: self._scrub(str(value)) for key, value in identity.items()},
            }
        text = page.evaluate("() => document.body ? document.body.innerText : ''")
        url = self._scrub(page.url)
        filled = []
        for entry in self.filled:
            entry = dict(entry)
            entry.pop("on_page", None)
            if entry["url"] == page.url and not entry["secret"]:
                # A form posted to its own address leaves the URL as it was: the field may be
                # gone, which is no reason to wait for it.
                field = self.locate(page, Target.model_validate(entry["target"]), strict=False)
                try:
                    entry["on_page"] = (
                        field.first.input_value(timeout=self._scaled(1_000))
                        if field.count()
                        else None
                    )
                except PlaywrightError:
                    entry["on_page"] = None
            filled.append(entry)
        return {
            "url": url,
            "target": target,
            "filled": filled,
            "page_text": self._scrub(" ".join(str(text).split()))[:PAGE_TEXT_LIMIT],
        }

    def _evidence(self, index: int, step: StepBase) -> tuple[dict[str, Any], bytes]:
        compared = self._compared(step, waiting=True)
        assert compared is not None  # a waiting read raises rather than give up
        page = self.page
        seen = observing.capture(page, secret_values=self.secret_values)
        targets = step.targets()
        if compared["target"] is not None:
            located = self.locate(page, targets[0])
            compared["target"]["box"] = located.bounding_box(timeout=self._scaled(5_000))
        # Lossless: this picture is what a person signs off on.
        screenshot = page.screenshot(
            type="png", mask=seen.masks or None, caret="initial", timeout=self._scaled(10_000)
        )
        evidence = {
            "step_index": index,
            "step_id": step.id,
            **compared,
            "action": self.words(
                f"{describe_step(step).removesuffix(' — irreversible')} on {compared['url']}"
            ),
            # What the runner waits for before calling the action done (and what it does with a
            # confirm() the click opens): reviewers approve the action with its success test.
            "expect": self._expect_words(step.expect) if step.expect else "",
            "dialog": step.dialog or "" if isinstance(step, ClickStep) else "",
            "title": seen.observation.title,
            "inputs": dict(self.plan.inputs),
            "outputs": {key: _plain(value) for key, value in self.outputs.items()},
            "observation": seen.observation.to_dict(),
        }
        if self._operators:
            evidence["operators"] = list(self._operators)
        return evidence, screenshot

    def _watch(self, context: BrowserContext) -> None:
        self._pages = [p for p in context.pages if not p.is_closed()] or [context.new_page()]
        for page in self._pages:
            page.on("dialog", self._dialog)
        context.on("page", self._new_page)

    def _new_page(self, page: Page) -> None:
        # A click that opens a tab moves the robot to it, as it would a person.
        self._pages.append(page)
        page.on("dialog", self._dialog)

    def _drain_control_dialogs(self) -> None:
        """Let Playwright deliver what it received while a person had the browser: a dialog
        they answered (or that was dismissed at the hand-back) is theirs, not the next step's.
        Sync Playwright delivers events only inside a call, in the order they came, so one
        round trip brings every earlier one."""
        self._control_dialogs = True
        try:
            with contextlib.suppress(PlaywrightError, StepFailed):
                self.page.evaluate("0")
        finally:
            self._control_dialogs = False

    def _dialog(self, dialog: Any) -> None:
        """Answer a confirm()/alert()/prompt() as the current click step says. One the workflow
        did not plan for is declined (never say yes on its behalf) and fails the step."""
        if self._control_dialogs:
            # Opened while a person had control: they answered it, or the hand-back
            # dismissed it (the control session records which).
            with contextlib.suppress(PlaywrightError):
                dialog.dismiss()
            return
        message = self._scrub(" ".join(str(dialog.message).split())[:500])
        plan = self._dialog_plan
        try:
            if plan is not None and plan.dialog == "accept":
                if dialog.type == "prompt":
                    text = self.text(plan.prompt_text) if plan.prompt_text is not None else None
                    dialog.accept(text if text is not None else dialog.default_value)
                else:
                    dialog.accept()
                action = "accepted"
            else:
                dialog.dismiss()
                action = "dismissed"
        except PlaywrightError:
            action = "gone before it was answered"
        self._dialogs.append({"type": dialog.type, "message": message, "action": action})
        if plan is None:
            self._unexpected_dialogs.append(f"a {dialog.type} dialog saying '{message}'")

    @property
    def page(self) -> Page:
        open_pages = [p for p in self._pages if not p.is_closed()]
        if not open_pages:
            raise StepFailed("the browser has no open page (it was closed or crashed)")
        return open_pages[-1]

    # One step ------------------------------------------------------------------------------

    def _execute(self, context: BrowserContext, index: int, step: StepBase) -> StepRecord:
        started = datetime.now(UTC)
        clock = time.monotonic()
        self._notes = []
        record = StepRecord(
            index=index,
            step_id=step.id,
            step_type=step.type,
            sentence=self.words(describe_step(step)),
            status="succeeded",
            started_at=started,
            duration_ms=0,
        )
        timeout = self._timeout(step)
        self._verdict = ""
        self._dialogs, self._unexpected_dialogs = [], []
        self._dialog_plan = step if isinstance(step, ClickStep) and step.dialog else None
        try:
            baseline = self._baseline = self._refusal_baseline()
            with ResponseWatch(context) as watch:
                self._act(step, record, timeout)
                self._after(step, baseline, watch, timeout)
        except Refused as exc:
            self._verdict = "refused"
            record.status = "failed"
            record.error = self._scrub(f"the portal refused: {exc}")
        except Unconfirmed as exc:
            self._verdict = "unconfirmed"
            record.status = "failed"
            record.error = self._scrub(str(exc))
        except Unanswered as exc:
            self._verdict = "unanswered"
            record.status = "failed"
            record.error = self._scrub(str(exc))
        except StepFailed as exc:
            record.status = "failed"
            record.error = self._scrub(str(exc))
        except PlaywrightTimeout as exc:
            record.status = "failed"
            record.error = self._scrub(self._explain_timeout(step, exc))
        except PlaywrightError as exc:
            record.status = "failed"
            record.error = self._scrub(_first_line(str(exc)))
        if self._notes:
            note = "; ".join(self._notes)
            record.error = f"{record.error} ({note})" if record.error else note
        record.error = self.words(record.error)
        following = self.plan.steps[index + 1 : index + 2]
        self._capture(
            record,
            touched_page=not isinstance(step, READ_ONLY_STEPS),
            # Only a read-only step can reuse this evidence: mark the page for it alone.
            watch=isinstance(step, READ_ONLY_STEPS)
            or any(s.get("type") in READ_ONLY_TYPES for s in following),
        )
        if self._dialogs:
            record.observation = {**(record.observation or {}), "dialogs": list(self._dialogs)}
        self._dialog_plan = None
        try:
            self._known_refusals = set(visible_refusals(self.page))
        except (StepFailed, PlaywrightError):
            self._known_refusals = None
        record.duration_ms = int((time.monotonic() - clock) * 1000)
        return record

    # Outcomes and refusals -------------------------------------------------------------------

    def _refusal_baseline(self) -> set[str]:
        if self._known_refusals is not None:
            return self._known_refusals
        return set(visible_refusals(self.page))

    def _new_refusals(self, baseline: set[str]) -> list[str]:
        return [m for m in visible_refusals(self.page) if m not in baseline]

    def new_refusals(self) -> list[str]:
        return self._new_refusals(self._baseline)

    def _after(
        self, step: StepBase, baseline: set[str], watch: ResponseWatch, timeout: float
    ) -> None:
        """What the portal answered to the step that just acted: a dialog nobody planned for
        or a new refusal fails it; an expected outcome is waited for until seen or refused."""
        if self._unexpected_dialogs:
            raise StepFailed(
                f"the page opened {'; '.join(self._unexpected_dialogs)}, which this step does "
                "not expect (it was dismissed; a click step may say dialog: accept or dismiss)"
            )
        if step.expect is not None:
            self._await_outcome(step.expect, baseline, watch, timeout)
            return
        if isinstance(step, GotoStep):
            # Opening a page sends it nothing to refuse: its standing messages (a maintenance
            # notice) are part of it, and become the next step's baseline.
            return
        new = self._new_refusals(baseline)
        if new:
            raise Refused("; ".join(new))

    def _await_outcome(
        self, expect: Expect, baseline: set[str], watch: ResponseWatch, timeout: float
    ) -> None:
        """Poll until the portal shows ``expect`` (done) or a refusal (Refused); neither within
        ``timeout`` ms raises Unconfirmed. A refusal is looked for first: its words may contain
        the expected text ("already approved"). A submission that got no answer or a server
        error leaves it unknown: the outcome is still waited for (the page may retry), and at
        the timeout Unanswered says what was seen, whatever the page showed then (a script's
        "something went wrong" does not say whether the portal acted)."""
        clock = time.monotonic()
        failed_at: float | None = None
        # After a 4xx answer, how long to wait for the page to say why in its own words.
        grace = self._scaled(1_000) / 1000
        while True:
            page = self.page
            new = self._new_refusals(baseline)
            unanswered = watch.unanswered
            if new and not unanswered:
                raise Refused("; ".join(new))
            now = time.monotonic()
            timed_out = (now - clock) * 1000 >= timeout
            if not watch.refusals and self._outcome_seen(page, expect):
                return
            if watch.refusals and not unanswered:
                failed_at = failed_at if failed_at is not None else now
                if now - failed_at >= grace or timed_out:
                    raise Refused(self._http_refusal(page, watch.refusals[0]))
            if timed_out and unanswered:
                raise Unanswered(self._unanswered(page, unanswered[0], new))
            if timed_out:
                raise Unconfirmed(
                    f"the portal showed neither the expected outcome "
                    f"({self._expect_words(expect)}) nor a refusal within {int(timeout)} ms "
                    f"(the browser is at {page.url})"
                )
            page.wait_for_timeout(100)

    def _outcome_seen(self, page: Page, expect: Expect) -> bool:
        try:
            if expect.url is not None:
                return url_matches(page.url, self.text(expect.url))
            if expect.text is not None:
                return page.get_by_text(self.text(expect.text)).first.is_visible()
            assert expect.target is not None
            return self.locate(page, expect.target, strict=False).first.is_visible()
        except PlaywrightError:
            return False  # the page is between documents: look again

    def _http_refusal(self, page: Page, failure: FailedResponse) -> str:
        said = failure.describe()
        if failure.response is None:
            # An error page: its heading and first paragraph are the portal's words.
            try:
                words = page.evaluate(_ERROR_PAGE_WORDS)
            except PlaywrightError:
                words = ""
            if words:
                said = f"{words} ({said})"
        return said

    def _unanswered(self, page: Page, failure: FailedResponse, new: list[str]) -> str:
        """What was seen of a submission the portal did not answer, or answered with a server
        error: the status or network error, the address and any words on the page."""
        if failure.by_proxy or failure.network_error:
            said = f"no answer from the portal: {failure.describe()}"
        else:
            said = f"server error: {self._http_refusal(page, failure)}"
        if new:
            said += f"; the page then showed: {'; '.join(new)}"
        if page.url.startswith("chrome-error:"):
            return f"{said} (the browser shows its own error page)"
        return f"{said} (the browser is at {page.url})"

    def _expect_words(self, expect: Expect) -> str:
        """The expected outcome with this run's values in it."""
        try:
            if expect.text is not None:
                return f"the page shows '{self.text(expect.text)}'"
            if expect.url is not None:
                return f"the address matches {self.text(expect.url)}"
        except StepFailed:
            pass
        return expect.describe()

    def _action_result(self, step: StepBase) -> str:
        parts = []
        if step.expect is not None:
            parts.append(
                f"the portal showed the expected outcome: {self._expect_words(step.expect)}"
            )
        parts += [
            f"the {d['type']} dialog said '{d['message']}' — {d['action']}" for d in self._dialogs
        ]
        return "; ".join(parts)

    def _timeout(self, step: StepBase) -> float:
        remaining_ms = (self.plan.deadline - time.time()) * 1000
        return max(100.0, min(self._scaled(step.timeout_ms), remaining_ms))

    def _scaled(self, ms: float) -> float:
        return float(ms) * self.plan.time_scale

    def _capture(self, record: StepRecord, *, touched_page: bool, watch: bool = True) -> None:
        """Take the step's evidence: only what must be read at this instant (the serialised
        page, the masks, the picture). The numbered observation is built later by the writer
        (``sessions.engine.recording.finish``), off the runner's path."""
        try:
            page = self.page
            page.wait_for_load_state("domcontentloaded", timeout=self._scaled(5_000))
        except (StepFailed, PlaywrightError):
            return
        try:
            watcher = self._watcher(page)
            mark = watcher.mark() if watch else None
            last = self._last_capture
            if (
                not touched_page
                and mark is not None
                and last is not None
                and last.page is page
                and last.mark == mark
            ):
                # Same document, no mutation, input or scroll since the last picture, and this
                # step sent no input: that evidence shows this moment too, at no cost.
                record.url = last.taken.url
                record.title = last.taken.shown_title
                record.pending = last.taken
                record.screenshot = last.screenshot
                return
            taken = observing.take(page, secret_values=self.secret_values, watch=watcher)
            record.url = page.url
            record.title = taken.shown_title
            record.pending = taken
            if not touched_page and last is not None and last.taken.key == taken.key:
                # Same URL, controls, texts and layout as the last picture (a page whose
                # changes the watch cannot see, such as one with iframes): reuse the picture.
                record.screenshot = last.screenshot
            elif taken.masks:
                record.screenshot = watcher.masked_screenshot(
                    taken.mask_paths, quality=SCREENSHOT_QUALITY
                ) or page.screenshot(
                    # Fields in frames, or fields that moved while the picture was taken: the
                    # browser paints the masks itself.
                    type="jpeg",
                    quality=SCREENSHOT_QUALITY,
                    caret="initial",
                    mask=taken.masks,
                    timeout=self._scaled(10_000),
                )
            else:
                record.screenshot = watcher.screenshot(quality=SCREENSHOT_QUALITY)
            self._last_capture = _Seen(
                page=page, mark=mark, taken=taken, screenshot=record.screenshot
            )
        except PlaywrightError as exc:
            self._last_capture = None
            # Evidence that cannot be taken is said so, never faked.
            note = f"evidence incomplete: {_first_line(str(exc))}"
            record.error = f"{record.error}; {note}" if record.error else note

    def _watcher(self, page: Page) -> observing.PageWatch:
        watcher = self._watches.get(id(page))
        if watcher is None or watcher.page is not page:
            watcher = self._watches[id(page)] = observing.PageWatch(page)
        return watcher

    def masks(self, page: Page) -> list[Locator]:
        """What to hide in a picture of ``page`` now: the last evidence's masks when the page has
        not changed since it was taken, else those of a fresh look."""
        watcher = self._watcher(page)
        last = self._last_capture
        if (
            last is not None
            and last.page is page
            and last.mark is not None
            and watcher.mark() == last.mark
        ):
            return last.taken.masks
        return observing.take(page, secret_values=self.secret_values, watch=watcher).masks

    # Actions -------------------------------------------------------------------------------

    def _act(self, step: StepBase, record: StepRecord, timeout: float) -> None:
        act = steps.act_of(step)
        if act is None:  # pragma: no cover - the schema has no other step types
            raise StepFailed(f"unknown step type {type(step).__name__}")
        act(self, step, record, timeout)

    def settle(self, page: Page) -> None:
        # A click may navigate or open a tab; let the new document load before observing it.
        try:
            self.page.wait_for_load_state("load", timeout=self._scaled(10_000))
        except PlaywrightError:
            return

    # Targets, text and files -----------------------------------------------------------------

    def locate(self, scope: Page | Locator, target: Target, *, strict: bool = True) -> Locator:
        base: Any = scope
        for frame in target.frame:
            base = base.frame_locator(frame)
        if target.role:
            name = self.text(target.name) if target.name else None
            locator = base.get_by_role(target.role, name=name, exact=target.exact)
        elif target.label:
            locator = base.get_by_label(self.text(target.label), exact=target.exact)
        elif target.placeholder:
            locator = base.get_by_placeholder(self.text(target.placeholder), exact=target.exact)
        elif target.text:
            locator = base.get_by_text(self.text(target.text), exact=target.exact)
        elif target.test_id:
            locator = base.get_by_test_id(target.test_id)
        else:
            locator = base.locator(str(target.css))
        if target.nth is not None:
            return locator.nth(target.nth)
        if not strict:
            return locator
        count = locator.count()
        if count > 1:
            raise StepFailed(
                f"{count} elements match {target.describe()} on {self.page.url}; "
                "make the target more exact or add nth"
            )
        return locator

    def _explain_timeout(self, step: StepBase, exc: PlaywrightTimeout) -> str:
        """Why a step ran out of time, in the page's terms: a target that is not there, one that
        something else covers, one that is hidden or disabled. Playwright's own text last."""
        acts = not isinstance(step, READ_ONLY_STEPS)
        for target in step.targets():
            try:
                locator = self.locate(self.page, target, strict=False)
                if locator.count() == 0:
                    return f"no {_noun(target)} on {self.page.url}"
                if not acts:
                    continue
                element = locator.first
                if not element.is_visible():
                    return f"{target.describe()} is on {self.page.url} but not visible"
                cover = self._covered_by(element, target)
                if cover:
                    return f"{cover} covers {target.describe()} on {self.page.url}"
                if not element.is_enabled():
                    return f"{target.describe()} is disabled on {self.page.url}"
            except (PlaywrightError, StepFailed):
                continue
        return f"gave up after {step.timeout_ms} ms: {_first_line(str(exc))}"

    def _covered_by(self, element: Locator, target: Target) -> str:
        """What lies over the middle of ``element`` ('' when nothing does), looked up in the
        element's own frame (or shadow root), then, for an element in an iframe, on the page."""
        wait = self._scaled(2_000)
        with contextlib.suppress(PlaywrightError):  # where it is still says something
            element.scroll_into_view_if_needed(timeout=wait)
        found = element.evaluate(_COVERED_BY, None, timeout=wait)
        if not found and target.frame:
            box = element.bounding_box(timeout=wait)
            if box is not None:
                middle = [box["x"] + box["width"] / 2, box["y"] + box["height"] / 2]
                found = self.page.evaluate(f"point => ({_COVERED_BY})(null, point)", middle)
        if not found:
            return ""
        kind, name = str(found.get("kind") or "element"), _clip(str(found.get("name") or ""))
        article = "an" if kind[:1] in "aeiou" else "a"
        return f"{article} {kind} '{name}'" if name else f"{article} {kind}"

    def text(self, template: str, *, secrets: bool = False) -> str:
        def value(namespace: str, name: str, sub: str | None) -> str:
            if namespace == "params":
                return _plain(self.plan.inputs.get(name, ""))
            if namespace == "outputs" and name in self.code_names:
                if not secrets:
                    raise StepFailed(f"the one-time code '{name}' may only be typed into a field")
                if name not in self._codes:
                    raise StepFailed(
                        f"the one-time code '{name}' was used up: a code is kept only until the "
                        "run next waits for a person"
                    )
                return self._codes[name]
            if namespace == "outputs":
                return _plain(self.outputs.get(name, ""))
            if not secrets:
                raise StepFailed("secrets may only be typed into fields")
            fields = self.plan.secrets.get(name, {})
            if sub == "code" and "seed" in fields:
                return self._secret(totp_code(fields["seed"]))
            if sub is None or sub not in fields:
                raise StepFailed(f"credential '{name}' has no field '{sub}' in this run")
            return fields[sub]

        references(template)  # refuses anything that is not a plain reference
        return re.sub(
            r"\{\{\s*(params|secrets|outputs)\.([a-z][a-z0-9_-]*)(?:\.([a-z_]+))?\s*\}\}",
            lambda m: value(m.group(1), m.group(2), m.group(3)),
            template,
        )

    def _secret(self, value: str) -> str:
        """``value``, from now on masked wherever this run shows text (a code made from a seed)."""
        if value and value not in self.secret_values:
            self.secret_values = sorted([*self.secret_values, value], key=len, reverse=True)
        return value

    def words(self, text: str) -> str:
        """``text`` for people: references filled in with this run's values, as they were typed
        ("no link named 'INV-1040'"), secrets masked. A reference with no value yet stays."""

        def value(match: re.Match[str]) -> str:
            namespace, name = match.group(1), match.group(2)
            if namespace == "params" and name in self.plan.inputs:
                return _plain(self.plan.inputs[name])
            if namespace == "outputs" and name in self.code_names:
                return MASK
            if namespace == "outputs" and name in self.outputs:
                return _plain(self.outputs[name])
            if namespace == "secrets":
                return MASK
            return match.group(0)

        return self._scrub(_REFERENCE.sub(value, text)) if text else text

    def _scrub(self, text: str) -> str:
        for secret in self.secret_values:
            text = text.replace(secret, MASK)
        return text

    def save_file(self, name: str, filename: str, content: bytes) -> ArtifactFile:
        directory = self.plan.artifacts_dir
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / _safe_filename(filename)
        path.write_bytes(content)
        return ArtifactFile(
            name=name,
            filename=path.name,
            path=path,
            sha256=hashlib.sha256(content).hexdigest(),
            size=len(content),
        )

    def save_download(self, name: str, download: Download) -> ArtifactFile:
        directory = self.plan.artifacts_dir
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / _safe_filename(download.suggested_filename or name)
        try:
            download.save_as(path)
        except PlaywrightError as exc:
            if "ENOENT" not in str(exc):
                raise
            # Playwright reads downloads from its own filesystem; a microVM keeps them inside.
            raise StepFailed(
                "the browser saved the file where the runner cannot read it: this sandbox "
                "(a microVM) keeps downloads inside the VM, which is not supported yet"
            ) from exc
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 16), b""):
                digest.update(chunk)
        return ArtifactFile(
            name=name,
            filename=path.name,
            path=path,
            sha256=digest.hexdigest(),
            size=path.stat().st_size,
        )


def _load_storage_state(context: BrowserContext, state: dict[str, Any]) -> None:
    """Put a captured storage state into ``context`` (the sandbox's default one, which a new
    context's ``storage_state=`` cannot reach): cookies directly, local storage origin by origin
    on a page that answers every request itself."""
    cookies = state.get("cookies") or []
    if cookies:
        context.add_cookies(cookies)
    for origin in state.get("origins") or []:
        items = origin.get("localStorage") or []
        if not items:
            continue
        page = context.new_page()
        try:
            page.route(
                "**/*",
                lambda route: route.fulfill(status=200, content_type="text/html", body=_BLANK),
            )
            page.goto(origin["origin"])
            page.evaluate(
                "items => { for (const i of items) localStorage.setItem(i.name, i.value); }",
                items,
            )
        finally:
            page.close()


def gate_reason(index: int, step: StepBase, gate: Gate) -> str:
    if gate.changes:
        return f"step {index + 1} '{step.id}': the page changed since it was approved"
    return f"step {index + 1} '{step.id}' is irreversible and needs approval"


def evidence_changes(approved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between the evidence a person approved and the page now, in words."""
    changes = []
    if approved.get("url") != current.get("url"):
        changes.append(f"the address changed: {approved.get('url')} → {current.get('url')}")
    old_target, new_target = approved.get("target") or {}, current.get("target") or {}
    for key in ("description", "tag", "id", "name", "type", "text", "form_action"):
        if old_target.get(key) != new_target.get(key):
            changes.append(
                f"the target's {key} changed: {old_target.get(key)!r} → {new_target.get(key)!r}"
            )
    old_fields = {entry["step_id"]: entry for entry in approved.get("filled", [])}
    for entry in current.get("filled", []):
        before = old_fields.get(entry["step_id"], {})
        if before.get("on_page") != entry.get("on_page"):
            changes.append(
                f"{entry['field']} now holds {entry.get('on_page')!r}, "
                f"not {before.get('on_page')!r}"
            )
    if approved.get("page_text") != current.get("page_text"):
        changes.append(f"the page's text changed: {_text_change(approved, current)}")
    return changes


def _text_change(approved: dict[str, Any], current: dict[str, Any]) -> str:
    import difflib

    old_words = str(approved.get("page_text", "")).split()
    new_words = str(current.get("page_text", "")).split()
    matcher = difflib.SequenceMatcher(a=old_words, b=new_words, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            return f"'{' '.join(old_words[i1:i2])[:80]}' → '{' '.join(new_words[j1:j2])[:80]}'"
    return "(whitespace only)"


def _noun(target: Target) -> str:
    if target.role:
        return f"{target.role} named '{target.name}'" if target.name else target.role
    if target.label:
        return f"field labelled '{target.label}'"
    if target.placeholder:
        return f"field with placeholder '{target.placeholder}'"
    if target.text:
        return f"text '{target.text}'"
    if target.test_id:
        return f"element with test id '{target.test_id}'"
    return f"element matching {target.css}"


def _clip(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "unknown error"


def _clean(text: str) -> str:
    return " ".join(text.split())


def _plain(value: Any) -> str:
    return str(value) if value is not None else ""


def _safe_filename(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "file"
    return cleaned[:200]
