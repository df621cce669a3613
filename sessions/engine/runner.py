"""The step runner: drives a sandboxed browser over CDP through a published workflow (no Django).

For every step it acts, then observes the page, screenshots it (secret fields masked), times it,
and hands a :class:`StepRecord` to the caller's sink, which persists and publishes it. The page
observed after one step is what the next step acts on, so each record carries the "after" view
and the previous record the "before" view.

Secrets are substituted at the last moment and typed by code. They never appear in a record:
sentences say "a secret", observations and screenshots are masked, error texts are scrubbed.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Literal

from playwright.sync_api import Browser, BrowserContext, Download, Locator, Page
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from sessions.engine import capturing, gatekeeping, locating, picking, steps, wording
from sessions.engine import observation as observing
from sessions.engine.driver import Connection, connect_timeout_ms, frames, with_browser
from sessions.engine.frames import FramePump
from sessions.engine.outcomes import (
    FailedResponse,
    ResponseWatch,
    visible_refusals,
)
from sessions.engine.plan import (
    Answer,
    Gate,
    HandBack,
    Pause,
    Question,
    RunOutcome,
    RunPlan,
    RunSink,
    SessionCheck,
    Status,
    secret_values_of,
)
from sessions.engine.steps.ask import AskStep, ask_audience
from sessions.engine.steps.base import (
    ArtifactFile,
    Refused,
    StepBase,
    StepFailed,
    StepRecord,
)
from sessions.engine.steps.click import ClickStep
from sessions.engine.steps.goto import GotoStep
from sessions.engine.steps.language import Expect, Target, url_matches
from sessions.engine.vocabulary import STALE_SESSION
from workflows.schema import STEP_ADAPTER, describe_step

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
# Kinds that look at the page without sending it any input.
_READ_ONLY_TYPES = frozenset(
    steps.kind_name(kind.model) for kind in steps.kinds() if not kind.model.touches_page
)
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
        self._last_capture: capturing.Seen | None = None
        self._watches: dict[int, observing.PageWatch] = {}
        # Draws the pages of a browser that draws only on request; the step pictures are its
        # frames. None: the browser draws on its own clock.
        self.frames: FramePump | None = None
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

    def run_with(self, browser: Browser, *, start_over: bool = False) -> RunOutcome:
        """``run`` on a browser connected already (a scratch session's held connection)."""
        return self._run(started_over(browser) if start_over else browser)

    def look(self, browser: Browser) -> StepRecord:
        """The page as it is now, recorded as a step's evidence is (a scratch session's look)."""
        context = browser.contexts[0] if browser.contexts else browser.new_context()
        self.frames = frames(browser)
        self._watch(context)
        try:
            record = StepRecord(
                index=-1, step_id="", step_type="look", sentence="The page as it is now",
                status="succeeded", started_at=datetime.now(UTC), duration_ms=0,
            )  # fmt: skip
            capturing.capture(self, record, touched_page=True, watch=False)
        finally:
            self._unwatch(context)
        record.status = "failed" if record.error else "succeeded"
        return record

    def pick(self, browser: Browser, element: dict[str, Any]) -> picking.Picked:
        """Targets for ``element`` of the last observation, tried on the page as it is now."""
        context = browser.contexts[0] if browser.contexts else browser.new_context()
        self.frames = frames(browser)
        self._watch(context)
        try:
            return picking.pick(
                self.page, element, lambda page, target: self.locate(page, target, strict=False)
            )
        finally:
            self._unwatch(context)

    def _run(self, browser: Browser) -> RunOutcome:
        context = browser.contexts[0] if browser.contexts else browser.new_context()
        self.frames = frames(browser)
        try:
            return self._run_in(context)
        finally:
            # A connection that outlives this runner (a scratch session's) must not keep
            # answering dialogs on its behalf.
            self._unwatch(context)

    def _run_in(self, context: BrowserContext) -> RunOutcome:
        fresh = self.plan.start_index == 0 and self.plan.approved_index is None
        if fresh and self.plan.storage_state:
            _load_storage_state(context, self.plan.storage_state)
        self._watch(context)
        if fresh and self.plan.session is not None and not self.plan.baking:
            try:
                seen = self._logged_out(self.plan.session)
            except StepFailed as exc:
                return self._outcome("failed", wording.scrub(self, str(exc)), 0, 0)
            if seen:
                return RunOutcome(status="failed", reason=STALE_SESSION, session_stale=seen)
        outcome = self._steps(context)
        if outcome.status != "succeeded" or not self.plan.baking or self.plan.session is None:
            return outcome
        try:
            seen = self._logged_out(self.plan.session)
        except StepFailed as exc:
            return self._outcome("failed", wording.scrub(self, str(exc)), outcome.next_index, 0)
        if seen:
            return self._outcome(
                "failed",
                wording.scrub(
                    self,
                    f"after the session steps {seen}: the login did not work, or the logged-in "
                    "check looks for the wrong element",
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
                f"the logged-in check could not open {check.url}: {wording.first_line(str(exc))}"
            ) from None
        if response is not None and response.status >= 500:
            raise StepFailed(f"the logged-in check: {page.url} answered HTTP {response.status}")
        try:
            self.locate(page, target, strict=False).first.wait_for(
                state="visible", timeout=self._scaled(5_000)
            )
        except PlaywrightTimeout:
            return f"{check.url} showed no {locating.noun(target)} (the browser was at {page.url})"
        return ""

    def _steps(self, context: BrowserContext) -> RunOutcome:
        executed = 0
        index = self.plan.start_index
        end = len(self.plan.steps) if self.plan.stop_index is None else self.plan.stop_index
        for index in range(self.plan.start_index, end):
            step = STEP_ADAPTER.validate_python(self.plan.steps[index])
            assert isinstance(step, StepBase)
            if self.plan.rehearsal and (
                step.irreversible or isinstance(step, AskStep) or step.id in self.plan.skip
            ):
                self.sink.step_finished(self._skipped(index, step))
                continue
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
                    gate = gatekeeping.gate(self, index, step)
                except (StepFailed, PlaywrightError) as exc:
                    reason = self.words(wording.first_line(str(exc)))
                    return self._outcome(
                        "failed",
                        f"could not gather the approval evidence for step {index + 1}: {reason}",
                        index,
                        executed,
                        step,
                    )
                if gate is not None:
                    return self._outcome(
                        "approval_required", gatekeeping.gate_reason(index, step, gate), index,
                        executed, step, gate=gate,
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
        return self._outcome("succeeded", "", end, executed)

    def _skipped(self, index: int, step: StepBase) -> StepRecord:
        why = (
            "it is irreversible"
            if step.irreversible
            else self.plan.skip.get(step.id) or "it asks a person"
        )
        return StepRecord(
            index=index,
            step_id=step.id,
            step_type=step.type,
            sentence=self.words(describe_step(step)),
            status="skipped",
            started_at=datetime.now(UTC),
            duration_ms=0,
            error=f"never done in a scratch session: {why}",
        )

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
            "urls": [wording.scrub(self, url) for url in handed.urls],
        }
        if handed.dialogs:
            operator["dialogs"] = [wording.scrub(self, words) for words in handed.dialogs]
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
            self._codes[step.save_as] = wording.remember_secret(self, answer.value)
        else:
            self.outputs[step.save_as] = answer.value
            record.outputs[step.save_as] = answer.value
        capturing.capture(self, record, touched_page=False)
        record.duration_ms = int((time.monotonic() - clock) * 1000)
        return record

    def _watch(self, context: BrowserContext) -> None:
        self._pages = [p for p in context.pages if not p.is_closed()] or [context.new_page()]
        for page in self._pages:
            page.on("dialog", self._dialog)
        context.on("page", self._new_page)

    def _unwatch(self, context: BrowserContext) -> None:
        # Removing a listener that was never added (a run that stopped before watching)
        # raises KeyError in the event emitter: nothing to remove then.
        with contextlib.suppress(PlaywrightError, KeyError, ValueError):
            context.remove_listener("page", self._new_page)
            for page in self._pages:
                if not page.is_closed():
                    page.remove_listener("dialog", self._dialog)

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
        message = wording.scrub(self, " ".join(str(dialog.message).split())[:500])
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
            record.error = wording.scrub(self, f"the portal refused: {exc}")
        except Unconfirmed as exc:
            self._verdict = "unconfirmed"
            record.status = "failed"
            record.error = wording.scrub(self, str(exc))
        except Unanswered as exc:
            self._verdict = "unanswered"
            record.status = "failed"
            record.error = wording.scrub(self, str(exc))
        except StepFailed as exc:
            record.status = "failed"
            record.error = wording.scrub(self, str(exc))
        except PlaywrightTimeout as exc:
            record.status = "failed"
            record.error = wording.scrub(self, locating.explain_timeout(self, step, exc))
        except PlaywrightError as exc:
            record.status = "failed"
            record.error = wording.scrub(self, wording.first_line(str(exc)))
        if self._notes:
            note = "; ".join(self._notes)
            record.error = f"{record.error} ({note})" if record.error else note
        record.error = self.words(record.error)
        following = self.plan.steps[index + 1 : index + 2]
        capturing.capture(
            self,
            record,
            touched_page=step.touches_page,
            # Only a read-only step can reuse this evidence: mark the page for it alone.
            watch=not step.touches_page
            or any(s.get("type") in _READ_ONLY_TYPES for s in following),
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

    # What step kinds use of the runner (``steps.base.Acting``) --------------------------------

    def locate(self, scope: Page | Locator, target: Target, *, strict: bool = True) -> Locator:
        return locating.locate(self, scope, target, strict=strict)

    def masks(self, page: Page) -> list[Locator]:
        return capturing.masks(self, page)

    def text(self, template: str, *, secrets: bool = False) -> str:
        return wording.fill_in(self, template, secrets=secrets)

    def words(self, text: str) -> str:
        return wording.words(self, text)

    def save_file(self, name: str, filename: str, content: bytes) -> ArtifactFile:
        directory = self.plan.artifacts_dir
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / safe_filename(filename)
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
        path = directory / safe_filename(download.suggested_filename or name)
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


def started_over(browser: Browser) -> Browser:
    """``browser`` with what it held forgotten: cookies, storage, its other tabs, the page."""
    context = browser.contexts[0] if browser.contexts else browser.new_context()
    context.clear_cookies()
    pages = [p for p in context.pages if not p.is_closed()]
    for page in pages[1:]:
        page.close()
    page = pages[0] if pages else context.new_page()
    page.goto("about:blank")
    # Storage outlives cookies; a page of the portal's origin would need opening to clear its
    # own, so the browser is asked to clear every origin's.
    cdp = context.new_cdp_session(page)
    try:
        cdp.send("Storage.clearDataForOrigin", {"origin": "*", "storageTypes": "all"})
    except PlaywrightError:
        pass
    finally:
        cdp.detach()
    return browser


def safe_filename(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "file"
    return cleaned[:200]
