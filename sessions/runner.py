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
import fnmatch
import hashlib
import hmac
import re
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Literal, Protocol

from playwright.sync_api import Browser, BrowserContext, Download, Locator, Page
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from sessions import observation as observing
from sessions.driver import with_browser
from workflows.schema import (
    STEP_ADAPTER,
    AssertStep,
    CheckStep,
    ClickStep,
    CompareCheck,
    CountCheck,
    DownloadStep,
    ExtractField,
    ExtractStep,
    FillStep,
    GotoStep,
    LoginStep,
    PressStep,
    ScreenshotStep,
    SelectStep,
    StepBase,
    Target,
    TextCheck,
    UncheckStep,
    UrlCheck,
    WaitForStep,
    describe_step,
    references,
)

MASK = "••••"
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
# Steps that look at the page without sending it any input.
READ_ONLY_STEPS = (WaitForStep, ExtractStep, AssertStep, ScreenshotStep)
# The whole reason a forked run gives when it woke up logged out; people act on these words.
STALE_SESSION = "session template is stale — re-bake"
# A blank page served in place of an origin while its local storage is restored: nothing of the
# restore reaches the portal.
_BLANK = "<!doctype html><title>restoring</title>"


class StepFailed(Exception):
    """A step could not do what it says; the message is for people."""


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
    outputs: dict[str, Any] = field(default_factory=dict)
    artifacts: list[ArtifactFile] = field(default_factory=list)


@dataclass(frozen=True)
class SessionCheck:
    """How to tell a logged-in browser: ``logged_in`` (a Target, as data) shows at ``url``."""

    url: str
    logged_in: dict[str, Any]


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


Status = Literal[
    "succeeded",
    "failed",
    "approval_required",
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
    # Set when the page no longer matched the evidence of an earlier approval.
    changes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunOutcome:
    status: Status
    reason: str = ""
    failed_step: str = ""
    next_index: int = 0
    outputs: dict[str, Any] = field(default_factory=dict)
    steps_executed: int = 0
    gate: Gate | None = None
    # A fork that woke up logged out: what the check saw (the reason is STALE_SESSION).
    session_stale: str = ""
    # A bake's capture: cookies and local storage, as secret as the password that made them.
    storage_state: dict[str, Any] | None = None


class RunSink(Protocol):
    def step_finished(self, record: StepRecord) -> None: ...

    def action_starting(self, index: int) -> None:
        """Durably record the intent to perform the approved action; raise to forbid it."""
        ...

    def action_finished(self, index: int) -> None:
        """Durably record that the approved action completed."""
        ...

    def stop_reason(self) -> str | None:
        """A reason to stop before the next step (the run was cancelled), or None."""


def totp_code(seed: str, *, at: float | None = None, digits: int = 6, period: int = 30) -> str:
    """RFC 6238 code for a base32 seed (SHA-1, the portals' default)."""
    key = base64.b32decode(seed.upper() + "=" * (-len(seed) % 8))
    counter = int((time.time() if at is None else at) // period)
    digest = hmac.new(key, struct.pack(">Q", counter), hashlib.sha1).digest()
    offset = digest[-1] & 0x0F
    number = struct.unpack(">I", digest[offset : offset + 4])[0] & 0x7FFFFFFF
    return str(number % 10**digits).zfill(digits)


class Runner:
    def __init__(self, plan: RunPlan, sink: RunSink) -> None:
        self.plan = plan
        self.sink = sink
        self.outputs: dict[str, Any] = dict(plan.outputs)
        self.secret_values = sorted(
            {v for fields in plan.secrets.values() for v in fields.values() if v},
            key=len,
            reverse=True,
        )
        self._pages: list[Page] = []
        self._notes: list[str] = []
        # What this run typed into which field (secrets masked), for the approval evidence.
        self._filled: list[dict[str, Any]] = list((plan.approved_evidence or {}).get("filled", []))
        # The last step's (snapshot, screenshot), to reuse when a read-only step changed nothing.
        self._last_capture: tuple[str, bytes] | None = None

    # The loop ------------------------------------------------------------------------------

    def run(self, cdp_url: str, *, artifacts_dir: str | None = None) -> RunOutcome:
        return with_browser(cdp_url, self._run, artifacts_dir=artifacts_dir)

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
        if response is not None and response.headers.get("x-pandaweb-blocked"):
            raise StepFailed(f"{check.url} is blocked by the egress policy")
        if response is not None and response.status >= 500:
            raise StepFailed(f"the logged-in check: {page.url} answered HTTP {response.status}")
        try:
            self._locate(page, target, strict=False).first.wait_for(
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
            if step.irreversible:
                try:
                    gate = self._gate(index, step)
                except (StepFailed, PlaywrightError) as exc:
                    reason = self._scrub(_first_line(str(exc)))
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
                if record.status == "failed":
                    self.sink.step_finished(record)
                    return self._outcome(
                        "action_uncertain",
                        f"the approved action failed half way and may have happened: "
                        f"{record.error}",
                        index,
                        executed,
                        step,
                    )
                self.sink.action_finished(index)
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

    def _outcome(
        self,
        status: Status,
        reason: str,
        index: int,
        executed: int,
        step: StepBase | None = None,
        *,
        gate: Gate | None = None,
    ) -> RunOutcome:
        return RunOutcome(
            status=status,
            reason=reason,
            failed_step=step.id if step is not None and status != "succeeded" else "",
            next_index=index,
            outputs=dict(self.outputs),
            steps_executed=executed,
            gate=gate,
        )

    # The approval gate -----------------------------------------------------------------------

    def _gate(self, index: int, step: StepBase) -> Gate | None:
        """The gate in front of irreversible step ``index``, or None when it may act now: it was
        approved and the page still shows what the reviewers saw."""
        evidence, screenshot = self._evidence(index, step)
        approved = self.plan.approved_evidence
        if index != self.plan.approved_index or approved is None:
            return Gate(evidence=evidence, screenshot=screenshot)
        changes = evidence_changes(approved, evidence)
        if changes:
            return Gate(evidence=evidence, screenshot=screenshot, changes=tuple(changes))
        return None

    def _evidence(self, index: int, step: StepBase) -> tuple[dict[str, Any], bytes]:
        page = self.page
        page.wait_for_load_state("domcontentloaded", timeout=self._scaled(5_000))
        seen = observing.capture(page, secret_values=self.secret_values)
        target: dict[str, Any] | None = None
        targets = step.targets()
        if targets:
            located = self._locate(page, targets[0])
            identity = located.evaluate(_TARGET_IDENTITY, timeout=self._scaled(5_000))
            box = located.bounding_box(timeout=self._scaled(5_000))
            target = {
                "description": targets[0].describe(),
                **{key: self._scrub(str(value)) for key, value in identity.items()},
                "box": box,
            }
        # Lossless: this picture is what a person signs off on.
        screenshot = page.screenshot(
            type="png", mask=seen.masks or None, caret="initial", timeout=self._scaled(10_000)
        )
        text = page.evaluate("() => document.body ? document.body.innerText : ''")
        url = self._scrub(page.url)
        filled = []
        for entry in self._filled:
            entry = dict(entry)
            entry.pop("on_page", None)
            if entry["url"] == page.url and not entry["secret"]:
                # A form posted to its own address leaves the URL as it was: the field may be
                # gone, which is no reason to wait for it.
                field = self._locate(page, Target.model_validate(entry["target"]), strict=False)
                try:
                    entry["on_page"] = (
                        field.first.input_value(timeout=self._scaled(1_000))
                        if field.count()
                        else None
                    )
                except PlaywrightError:
                    entry["on_page"] = None
            filled.append(entry)
        evidence = {
            "step_index": index,
            "step_id": step.id,
            "action": f"{describe_step(step).removesuffix(' — irreversible')} on {url}",
            "url": url,
            "title": seen.observation.title,
            "target": target,
            "filled": filled,
            "inputs": dict(self.plan.inputs),
            "outputs": {key: _plain(value) for key, value in self.outputs.items()},
            "page_text": self._scrub(" ".join(str(text).split()))[:PAGE_TEXT_LIMIT],
            "observation": seen.observation.to_dict(),
        }
        return evidence, screenshot

    def _watch(self, context: BrowserContext) -> None:
        self._pages = [p for p in context.pages if not p.is_closed()] or [context.new_page()]
        for page in self._pages:
            page.on("dialog", self._dialog)
        context.on("page", self._new_page)

    def _new_page(self, page: Page) -> None:
        # A click that opens a tab moves the robot to it, as it would a person.
        self._pages.append(page)
        # A confirm() the workflow did not plan for is declined: never say yes on our behalf.
        page.on("dialog", self._dialog)

    def _dialog(self, dialog: Any) -> None:
        self._notes.append(f"a {dialog.type} dialog said '{dialog.message[:200]}' — dismissed")
        dialog.dismiss()

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
            step_type=step.type,  # type: ignore[attr-defined]
            sentence=describe_step(step),
            status="succeeded",
            started_at=started,
            duration_ms=0,
        )
        timeout = self._timeout(step)
        try:
            self._act(step, record, timeout)
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
        self._capture(record, touched_page=not isinstance(step, READ_ONLY_STEPS))
        record.duration_ms = int((time.monotonic() - clock) * 1000)
        return record

    def _timeout(self, step: StepBase) -> float:
        remaining_ms = (self.plan.deadline - time.time()) * 1000
        return max(100.0, min(self._scaled(step.timeout_ms), remaining_ms))

    def _scaled(self, ms: float) -> float:
        return float(ms) * self.plan.time_scale

    def _capture(self, record: StepRecord, *, touched_page: bool) -> None:
        try:
            page = self.page
            page.wait_for_load_state("domcontentloaded", timeout=self._scaled(5_000))
        except (StepFailed, PlaywrightError):
            return
        try:
            seen = observing.capture(page, secret_values=self.secret_values)
            record.url = page.url
            record.title = seen.observation.title
            record.observation = seen.observation.to_dict()
            record.observation_chars = seen.observation.size_chars
            record.observation_tokens = seen.observation.token_estimate
            record.elements = seen.observation.elements
            last = self._last_capture
            if not touched_page and last is not None and last[0] == seen.snapshot:
                # Same URL, controls, texts and layout as the last picture, and this step sent no
                # input: that picture shows this moment too, and costs nothing to take again.
                record.screenshot = last[1]
            else:
                # JPEG and a visible caret: a third of the cost of a lossless picture, on every
                # step's critical path. Masked inputs are painted over by the browser itself.
                record.screenshot = page.screenshot(
                    type="jpeg",
                    quality=SCREENSHOT_QUALITY,
                    caret="initial",
                    mask=seen.masks or None,
                    timeout=self._scaled(10_000),
                )
            self._last_capture = (seen.snapshot, record.screenshot)
        except PlaywrightError as exc:
            self._last_capture = None
            # Evidence that cannot be taken is said so, never faked.
            note = f"evidence incomplete: {_first_line(str(exc))}"
            record.error = f"{record.error}; {note}" if record.error else note

    # Actions -------------------------------------------------------------------------------

    def _act(self, step: StepBase, record: StepRecord, timeout: float) -> None:
        page = self.page
        if isinstance(step, GotoStep):
            response = page.goto(self._text(step.url), wait_until="load", timeout=timeout)
            if response is not None and response.headers.get("x-pandaweb-blocked"):
                raise StepFailed(f"{step.url} is blocked by the egress policy")
            if response is not None and response.status >= 400:
                raise StepFailed(f"{page.url} answered HTTP {response.status}")
        elif isinstance(step, ClickStep):
            self._locate(page, step.target).click(timeout=timeout)
            self._settle(page)
        elif isinstance(step, FillStep):
            value = self._text(step.value, secrets=True)
            self._locate(page, step.target).fill(value, timeout=timeout)
            secret = "secrets." in step.value
            self._filled.append(
                {
                    "step_id": step.id,
                    "field": step.target.describe(),
                    "target": step.target.model_dump(exclude_defaults=True),
                    "url": page.url,
                    "value": MASK if secret else value,
                    "secret": secret,
                }
            )
        elif isinstance(step, SelectStep):
            self._select(page, step, timeout)
        elif isinstance(step, CheckStep):
            self._locate(page, step.target).check(timeout=timeout)
        elif isinstance(step, UncheckStep):
            self._locate(page, step.target).uncheck(timeout=timeout)
        elif isinstance(step, PressStep):
            if step.target is not None:
                self._locate(page, step.target).press(step.key, timeout=timeout)
            else:
                page.keyboard.press(step.key)
            self._settle(page)
        elif isinstance(step, WaitForStep):
            self._wait(page, step, timeout)
        elif isinstance(step, ExtractStep):
            for extract in step.fields:
                value = self._extract(page, extract, timeout)
                self.outputs[extract.name] = value
                record.outputs[extract.name] = value
        elif isinstance(step, AssertStep):
            failures = [f for f in (self._check(page, c) for c in step.checks) if f]
            if failures:
                raise StepFailed("; ".join(failures))
        elif isinstance(step, ScreenshotStep):
            png = page.screenshot(
                type="png",
                full_page=step.full_page,
                mask=observing.secret_locators(page, self.secret_values),
                timeout=timeout,
            )
            record.artifacts.append(self._save(step.name, f"{step.name}.png", png))
            self.outputs[step.name] = f"{step.name}.png"
        elif isinstance(step, DownloadStep):
            with page.expect_download(timeout=timeout) as download_info:
                self._locate(page, step.target).click(timeout=timeout)
            artifact = self._save_download(step.name, download_info.value)
            record.artifacts.append(artifact)
            self.outputs[step.name] = artifact.filename
        elif isinstance(step, LoginStep):
            fields = self.plan.secrets.get(step.credential)
            if not fields or "username" not in fields or "password" not in fields:
                raise StepFailed(f"credential '{step.credential}' is not available to this run")
            self._locate(page, step.username).fill(fields["username"], timeout=timeout)
            self._locate(page, step.password).fill(fields["password"], timeout=timeout)
            self._locate(page, step.submit).click(timeout=timeout)
            self._settle(page)
        else:  # pragma: no cover - the schema has no other step types
            raise StepFailed(f"unknown step type {type(step).__name__}")

    def _settle(self, page: Page) -> None:
        # A click may navigate or open a tab; let the new document load before observing it.
        try:
            self.page.wait_for_load_state("load", timeout=self._scaled(10_000))
        except PlaywrightError:
            return

    def _select(self, page: Page, step: SelectStep, timeout: float) -> None:
        element = self._locate(page, step.target)
        option = self._text(step.option)
        tag = element.evaluate("e => e.tagName", timeout=timeout)
        if str(tag).lower() == "select":
            element.select_option(label=option, timeout=timeout)
            return
        # A custom dropdown: open it, then choose the option by its accessible name.
        element.click(timeout=timeout)
        choice = page.get_by_role("option", name=option, exact=True)
        if choice.count() == 0:
            raise StepFailed(f"the dropdown {step.target.describe()} has no option '{option}'")
        choice.first.click(timeout=timeout)

    def _wait(self, page: Page, step: WaitForStep, timeout: float) -> None:
        if step.target is not None:
            self._locate(page, step.target).wait_for(state=step.state, timeout=timeout)
        elif step.url is not None:
            pattern = self._text(step.url)
            try:
                page.wait_for_url(pattern, timeout=timeout)
            except PlaywrightTimeout:
                raise StepFailed(
                    f"the address did not come to match {pattern} (it is {page.url})"
                ) from None
        elif step.text is not None:
            text = self._text(step.text)
            try:
                page.get_by_text(text).first.wait_for(state="visible", timeout=timeout)
            except PlaywrightTimeout:
                raise StepFailed(f"the page did not show '{text}' on {page.url}") from None
        else:
            page.wait_for_load_state("networkidle", timeout=timeout)

    def _extract(self, page: Page, extract: ExtractField, timeout: float) -> Any:
        # A rows target matches every row: many matches are the point, not an ambiguity.
        element = self._locate(page, extract.target, strict=extract.kind != "rows")
        if extract.kind == "rows":
            rows = []
            for row in element.all():
                rows.append(
                    {
                        name: _clean(self._locate(row, target).first.inner_text(timeout=timeout))
                        for name, target in (extract.columns or {}).items()
                    }
                )
            return rows
        if extract.kind == "attribute":
            value = element.get_attribute(str(extract.attribute), timeout=timeout)
            if value is None:
                raise StepFailed(
                    f"{extract.target.describe()} has no attribute '{extract.attribute}'"
                )
            return value
        text = _clean(element.inner_text(timeout=timeout))
        if extract.kind == "text":
            return text
        if extract.kind in ("number", "money"):
            return str(_parse_number(text, extract.name))
        return _parse_date(text, extract.date_format, extract.name)

    def _check(self, page: Page, check: Any) -> str | None:
        if isinstance(check, TextCheck):
            present = page.get_by_text(check.text).count() > 0
            if check.kind == "text_present" and not present:
                return f"the page does not show '{check.text}' ({page.url})"
            if check.kind == "text_absent" and present:
                return f"the page shows '{check.text}' ({page.url})"
            return None
        if isinstance(check, UrlCheck):
            if not _glob_match(page.url, check.pattern):
                return f"the address {page.url} does not match {check.pattern}"
            return None
        if isinstance(check, CountCheck):
            count = self._locate(page, check.target, strict=False).count()
            if not _compare(count, check.op, check.count):
                return (
                    f"found {count} of {check.target.describe()}, expected {check.op} {check.count}"
                )
            return None
        assert isinstance(check, CompareCheck)
        left, right = self._operand(check.left), self._operand(check.right)
        if not _compare(left, check.op, right):
            return f"{check.left} ({left}) {check.op} {check.right} ({right}) is not true"
        return None

    def _operand(self, text: str) -> Any:
        namespace, _, name = text.partition(".")
        if namespace == "outputs" and name in self.outputs:
            return self.outputs[name]
        if namespace == "params" and name in self.plan.inputs:
            return self.plan.inputs[name]
        if namespace in ("outputs", "params"):
            raise StepFailed(f"{text} has no value in this run")
        return text

    # Targets, text and files -----------------------------------------------------------------

    def _locate(self, scope: Page | Locator, target: Target, *, strict: bool = True) -> Locator:
        base: Any = scope
        for frame in target.frame:
            base = base.frame_locator(frame)
        if target.role:
            name = self._text(target.name) if target.name else None
            locator = base.get_by_role(target.role, name=name, exact=target.exact)
        elif target.label:
            locator = base.get_by_label(self._text(target.label), exact=target.exact)
        elif target.placeholder:
            locator = base.get_by_placeholder(self._text(target.placeholder), exact=target.exact)
        elif target.text:
            locator = base.get_by_text(self._text(target.text), exact=target.exact)
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
        for target in step.targets():
            try:
                if self._locate(self.page, target, strict=False).count() == 0:
                    return f"no {_noun(target)} on {self.page.url}"
            except (PlaywrightError, StepFailed):
                continue
        return f"gave up after {step.timeout_ms} ms: {_first_line(str(exc))}"

    def _text(self, template: str, *, secrets: bool = False) -> str:
        def value(namespace: str, name: str, sub: str | None) -> str:
            if namespace == "params":
                return _plain(self.plan.inputs.get(name, ""))
            if namespace == "outputs":
                return _plain(self.outputs.get(name, ""))
            if not secrets:
                raise StepFailed("secrets may only be typed into fields")
            fields = self.plan.secrets.get(name, {})
            if sub == "code" and "seed" in fields:
                return totp_code(fields["seed"])
            if sub is None or sub not in fields:
                raise StepFailed(f"credential '{name}' has no field '{sub}' in this run")
            return fields[sub]

        references(template)  # refuses anything that is not a plain reference
        return re.sub(
            r"\{\{\s*(params|secrets|outputs)\.([a-z][a-z0-9_-]*)(?:\.([a-z_]+))?\s*\}\}",
            lambda m: value(m.group(1), m.group(2), m.group(3)),
            template,
        )

    def _scrub(self, text: str) -> str:
        for secret in self.secret_values:
            text = text.replace(secret, MASK)
        return text

    def _save(self, name: str, filename: str, content: bytes) -> ArtifactFile:
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

    def _save_download(self, name: str, download: Download) -> ArtifactFile:
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


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "unknown error"


def _clean(text: str) -> str:
    return " ".join(text.split())


def _plain(value: Any) -> str:
    return str(value) if value is not None else ""


def _parse_number(text: str, name: str) -> Decimal:
    # "EUR 1,234.50", "1.234,50 €", "-12.00": keep the digits and the last decimal separator.
    digits = re.sub(r"[^\d,.\-]", "", text)
    if "," in digits and "." in digits:
        decimal_sep = "," if digits.rfind(",") > digits.rfind(".") else "."
        thousands = "." if decimal_sep == "," else ","
        digits = digits.replace(thousands, "").replace(decimal_sep, ".")
    elif "," in digits:
        head, _, tail = digits.rpartition(",")
        digits = f"{head.replace(',', '')}.{tail}" if len(tail) != 3 else digits.replace(",", "")
    try:
        return Decimal(digits)
    except InvalidOperation:
        raise StepFailed(f"'{text}' is not a number (extracting {name})") from None


def _parse_date(text: str, date_format: str | None, name: str) -> str:
    formats = (
        [date_format]
        if date_format
        else ["%Y-%m-%d", "%d %b %Y", "%d.%m.%Y", "%d/%m/%Y", "%b %d, %Y"]
    )
    for candidate in formats:
        try:
            return datetime.strptime(text, candidate).date().isoformat()
        except ValueError:
            continue
    raise StepFailed(f"'{text}' is not a date (extracting {name})")


def _glob_match(url: str, pattern: str) -> bool:
    # Playwright-style globs: ** crosses slashes; fnmatch's * already does, so both map to it.
    return fnmatch.fnmatchcase(url, pattern.replace("**", "*"))


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


def _safe_filename(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "file"
    return cleaned[:200]
