"""The worker's live feed with a person in control, against a real Chromium and the demo portal:
a dialog the page opens is theirs to answer (and is dismissed if they hand back without), and
the run's time limit ends their control."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from channels import DEFAULT_CHANNEL_LAYER
from channels.layers import channel_layers, get_channel_layer
from django.contrib.auth.models import User

from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from pandaweb.demo_portal.lab import LAB_SUPPLIER
from pandaweb.demo_portal.state import DEMO_PASSWORD, DEMO_USERNAME
from sessions import live
from sessions.engine.last_frame import LAST_FRAME, last_frame_at
from sessions.engine.plan import HandBack
from sessions.engine.screencast import BrowserTap, CdpError, Frame
from sessions.events import run_feed_group, run_live_group
from sessions.layer import layer_send, receive_group_on_this_loop
from sessions.live import LiveFeed
from sessions.models import ControlSession, Run
from tests.factories import user_with_role
from tests.sessions.test_control import running_run
from tests.sessions.test_screencast import run_apart

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


class Viewer:
    """What a viewer's consumer does, on a loop of its own thread: says it is there, sends
    requests, and keeps every message the feed sends to the run's live group."""

    def __init__(self, run_id: int, user: User) -> None:
        self.run_id = run_id
        self.user = user
        self.messages: list[dict[str, Any]] = []
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        self.channel = self._run(self._join())
        self._task = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)

    def _run(self, work: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(10)

    async def _join(self) -> str:
        layer = get_channel_layer()
        channel: str = await layer.new_channel("viewer.")
        await layer.group_add(run_live_group(self.run_id), channel)
        receive_group_on_this_loop(run_live_group(self.run_id))
        return channel

    async def _listen(self) -> None:
        layer = get_channel_layer()
        while True:
            self.messages.append(await layer.receive(self.channel))

    def send(self, message: dict[str, Any]) -> None:
        message = {"channel": self.channel, "user_id": self.user.pk, **message}
        self._run(layer_send(run_feed_group(self.run_id), message))

    def watch(self) -> None:
        self.send({"type": "live.watching", "present": True})

    def request(self, action: str, **data: Any) -> None:
        self.send(
            {"type": "live.request", "username": self.user.username, "action": action,
             "input": data}
        )  # fmt: skip

    def wait_for(self, wanted: Callable[[dict[str, Any]], bool], seconds: float = 20) -> dict:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for message in list(self.messages):
                if wanted(message):
                    return message
            time.sleep(0.02)
        kinds = [(m["type"], m.get("state", m.get("kind", ""))) for m in self.messages]
        raise AssertionError(f"no such message came; got {kinds}")

    def close(self) -> None:
        self._task.cancel()
        self._loop.call_soon_threadsafe(self._loop.stop)


class Page:
    """The run's browser as the test sees it, through a CDP client of its own (Playwright is
    not used here: its sync API holds an event loop on the test thread, where the database is
    set up). Nothing answers the page's dialogs but the feed, as while the runner waits."""

    def __init__(self, cdp_url: str) -> None:
        self.cdp_url = cdp_url

    def run(self, work: Callable[[BrowserTap], Coroutine[Any, Any, Any]]) -> Any:
        async def with_tap() -> Any:
            async def ignore(frame: Frame) -> None:
                return None

            tap = BrowserTap(self.cdp_url, secret_values=[], secret_fields=[], on_frame=ignore)
            await tap.open()
            try:
                return await work(tap)
            finally:
                await tap.close()

        return run_apart(with_tap)

    def evaluate(self, expression: str) -> Any:
        async def work(tap: BrowserTap) -> Any:
            return await _evaluate(tap, expression)

        return self.run(work)

    def wait_until(self, expression: str, seconds: float = 15) -> None:
        async def work(tap: BrowserTap) -> None:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                try:
                    if await _evaluate(tap, expression):
                        return
                except CdpError:
                    pass  # between two documents
                await asyncio.sleep(0.05)
            raise AssertionError(f"the page never had {expression}")

        self.run(work)

    def goto(self, url: str) -> None:
        async def work(tap: BrowserTap) -> None:
            await tap.call("Page.navigate", {"url": url}, session=tap._session)

        self.run(work)


async def _evaluate(tap: BrowserTap, expression: str) -> Any:
    answer = await tap.call(
        "Runtime.evaluate", {"expression": expression, "returnByValue": True},
        session=tap._session,
    )  # fmt: skip
    return (answer.get("result") or {}).get("value")


@pytest.fixture(autouse=True)
def a_channel_layer_of_its_own() -> Iterator[None]:
    """These tests receive on the default layer from a loop of their own; with Redis that
    instance then refuses every later test's loop, so it goes with the test."""
    yield
    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)


@pytest.fixture
def supplier_page(cdp_url: str, portal: str) -> Page:
    """The lab's supplier page, signed in, in the run's browser."""
    page = Page(cdp_url)
    page.goto(f"{portal}/login?next=/lab/supplier")
    page.wait_until("location.pathname === '/login' && document.readyState === 'complete'")
    page.evaluate(
        "document.cookie = 'acme_cookies=accepted; path=/';"
        f"document.getElementById('username').value = {json.dumps(DEMO_USERNAME)};"
        f"document.getElementById('password').value = {json.dumps(DEMO_PASSWORD)};"
        "document.querySelector('form[action=\"/login\"]').submit(); true"
    )
    page.wait_until("location.pathname === '/lab/supplier' && document.readyState === 'complete'")
    return page


@pytest.fixture
def files(settings: Any, tmp_path: Path) -> Path:
    settings.RUN_FILES_DIR = tmp_path / "runs"
    return tmp_path


@pytest.fixture
def held(cdp_url: str, files: Path) -> Iterator[tuple[Run, User, LiveFeed, Viewer]]:
    """A running run whose feed an operator has asked to control."""
    run = running_run()
    operator = user_with_role(Role.OPERATORS)
    feed = LiveFeed(
        run_id=run.pk, cdp_url=cdp_url, secret_values=[], secret_fields=[],
        files_dir=files / "run-files",
    )  # fmt: skip
    feed.start()
    viewer = Viewer(run.pk, operator)
    try:
        viewer.watch()
        viewer.request("take")
        viewer.wait_for(lambda m: m["type"] == "live.control" and m["state"] == "pending")
        yield run, operator, feed, viewer
    finally:
        viewer.close()
        feed.stop()


def hold_apart(feed: LiveFeed, deadline: float) -> Future[HandBack | None]:
    """The runner's pause before step 2, on a thread of its own (it blocks until handed back)."""
    pool = ThreadPoolExecutor(max_workers=1)
    held = pool.submit(feed.hold, 2, lambda: None, deadline)
    pool.shutdown(wait=False)
    return held


REMOVE_BUTTON = """[...document.querySelectorAll('button')]
  .some(b => b.textContent.includes('Remove supplier'))"""


def click_remove(page: Page, viewer: Viewer) -> None:
    """Click the page's Remove supplier button through the live view, as a fraction of the
    picture (the person clicks on what they see)."""
    viewer.wait_for(lambda m: m["type"] == "live.frame")
    x, y = page.evaluate(
        """(() => {
          const box = [...document.querySelectorAll('button')]
            .find(b => b.textContent.includes('Remove supplier')).getBoundingClientRect();
          return [(box.x + box.width / 2) / innerWidth, (box.y + box.height / 2) / innerHeight];
        })()"""
    )
    viewer.request("input", kind="click", x=x, y=y)


def test_the_person_in_control_answers_a_confirm_the_page_opens(
    supplier_page: Page, held: tuple[Run, User, LiveFeed, Viewer]
) -> None:
    run, operator, feed, viewer = held
    handed = hold_apart(feed, time.time() + 120)
    viewer.wait_for(lambda m: m["type"] == "live.control" and m["state"] == "active")

    click_remove(supplier_page, viewer)
    shown = viewer.wait_for(lambda m: m["type"] == "live.dialog" and m["kind"] == "confirm")
    assert shown["message"].startswith(f"Remove supplier {LAB_SUPPLIER}?")
    # While the dialog is open, nothing but an answer reaches the page.
    viewer.request("input", kind="key", key="x")
    refused = viewer.wait_for(lambda m: m["type"] == "live.refused")
    assert refused["reason"] == "the page shows a dialog: answer it first"
    viewer.request("input", kind="dialog", accept=True)
    viewer.wait_for(lambda m: m["type"] == "live.dialog" and m["kind"] == "")
    viewer.request("release")
    back = handed.result(30)

    supplier_page.wait_until("document.body.innerText.includes('was removed')")
    assert back is not None
    assert back.dialogs == (
        f"a confirm dialog saying 'Remove supplier {LAB_SUPPLIER}? Open invoices stay, but no "
        f"new orders can be placed. This cannot be undone.' — accepted by {operator.username}",
    )
    assert back.inputs == 2  # the click and the answer
    session = ControlSession.objects.get(run=run)
    kinds = [(e["kind"], e.get("action", "")) for e in session.inputs if e["kind"] != "navigated"]
    assert kinds == [("click", ""), ("dialog_opened", ""), ("dialog", "accepted")]
    closed = AuditEvent.objects.get(action="run.control_closed").after or {}
    assert {"dialog", "confirm", "accepted"} <= {
        value for entry in closed["input_events"] for value in entry.values()
        if isinstance(value, str)
    }  # fmt: skip


def test_a_dialog_nobody_answers_is_dismissed_when_control_is_handed_back(
    supplier_page: Page, held: tuple[Run, User, LiveFeed, Viewer]
) -> None:
    run, _operator, feed, viewer = held
    handed = hold_apart(feed, time.time() + 120)
    viewer.wait_for(lambda m: m["type"] == "live.control" and m["state"] == "active")

    click_remove(supplier_page, viewer)
    viewer.wait_for(lambda m: m["type"] == "live.dialog" and m["kind"] == "confirm")
    viewer.request("release")
    back = handed.result(30)

    # Dismissed: the form was not sent, the supplier is still there.
    assert supplier_page.evaluate(REMOVE_BUTTON) is True
    assert back is not None
    assert back.dialogs[0].endswith("— dismissed when control ended")
    assert back.inputs == 1  # the click; the dismissal was not theirs
    last = ControlSession.objects.get(run=run).inputs[-1]
    assert (last["kind"], last["action"]) == ("dialog", "dismissed when control ended")


def test_the_runs_time_limit_ends_the_control(
    supplier_page: Page, held: tuple[Run, User, LiveFeed, Viewer]
) -> None:
    run, operator, feed, viewer = held
    handed = hold_apart(feed, time.time() + 3)
    active = viewer.wait_for(lambda m: m["type"] == "live.control" and m["state"] == "active")
    assert active["seconds_left"] in (1, 2, 3)

    back = handed.result(30)

    assert back is not None
    reason = f"the run's time limit was reached while {operator.username} had control"
    session = ControlSession.objects.get(run=run)
    assert (session.closed_at is not None, session.close_reason) == (True, reason)
    closed = AuditEvent.objects.get(action="run.control_closed").after or {}
    assert closed["reason"] == reason
    viewer.wait_for(lambda m: m["type"] == "live.control" and m["note"] == reason)


def test_a_request_withdrawn_before_control_begins_is_audited_and_the_runner_goes_on(
    held: tuple[Run, User, LiveFeed, Viewer],
) -> None:
    run, operator, feed, viewer = held

    viewer.request("release")
    note = f"request withdrawn by {operator.username}"
    viewer.wait_for(lambda m: m["type"] == "live.control" and m["note"] == note)

    # The runner's next pause finds nobody waiting for the browser.
    assert feed.hold(2, lambda: None, time.time() + 120) is None
    assert not ControlSession.objects.filter(run=run).exists()
    withdrawn = AuditEvent.objects.get(action="run.control_request_withdrawn")
    assert (withdrawn.actor_id, withdrawn.run_id) == (operator.pk, run.pk)
    assert run.events.filter(type="control_request_withdrawn").count() == 1


def test_letting_go_while_the_control_session_opens_closes_it_and_withdraws_nothing(
    held: tuple[Run, User, LiveFeed, Viewer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release arrives while the session's row is written: the trail says the session
    opened and closed before the person had the browser, never that a request was withdrawn."""
    run, operator, feed, viewer = held
    note = f"{operator.username} let go before control began"
    opening = live.control_open

    def open_then_let_go(**kwargs: Any) -> ControlSession:
        session = opening(**kwargs)
        viewer.request("release")
        viewer.wait_for(lambda m: m["type"] == "live.control" and m["note"] == note)
        return session

    monkeypatch.setattr(live, "control_open", open_then_let_go)

    assert feed.hold(2, lambda: None, time.time() + 120) is None
    session = ControlSession.objects.get(run=run)
    assert (session.closed_at is not None, session.close_reason) == (True, note)
    assert not run.events.filter(type="control_request_withdrawn").exists()
    assert AuditEvent.objects.filter(action="run.control_closed").count() == 1


def test_the_feed_keeps_the_last_frame_a_viewer_saw_when_it_lets_go_of_the_browser(
    supplier_page: Page, held: tuple[Run, User, LiveFeed, Viewer], files: Path
) -> None:
    _run, _operator, feed, viewer = held
    viewer.wait_for(lambda m: m["type"] == "live.frame")
    assert last_frame_at(files / "run-files") is None

    feed.stop()

    kept = (files / "run-files" / LAST_FRAME).read_bytes()
    # The frame the viewers were sent last (it may reach this one after the feed stopped).
    shown = viewer.wait_for(lambda m: m["type"] == "live.frame" and m["jpeg"] == kept)
    assert last_frame_at(files / "run-files") == pytest.approx(shown["captured_at"], abs=0.01)
