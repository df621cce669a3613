"""Pages drawn on request: the runner's browser (chromium-headless-shell with begin-frame
control) draws a frame only when the frame pump asks, and a step's picture is the frame drawn
for that step. Pages that would hang or show the wrong moment if frames came at the wrong time,
served on loopback, run through a local sandbox behind the egress proxy."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from PIL import Image

from sessions.engine import recording
from sessions.engine.chromium import browser_label, find_chromium, is_headless_shell
from sessions.engine.driver import frames, with_browser
from sessions.engine.egress_policy import EgressPolicy
from sessions.engine.frames import FramePump
from sessions.engine.plan import RunPlan
from sessions.engine.proxy import EgressProxy
from sessions.engine.runner import Runner
from sessions.engine.sandbox.base import BEGIN_FRAME, FREE_RUNNING, SandboxSpec
from sessions.engine.sandbox.local import LocalBackend
from sessions.engine.screencast import BrowserTap, Frame

pytestmark = pytest.mark.browser

GREEN, RED, BLUE = (0, 160, 0), (200, 0, 0), (0, 0, 200)

PAGES = {
    # Paid, then a moment later something else: the step's picture must show "Paid".
    "/change-after": """<!doctype html><title>Pay</title>
<body style="margin:0;height:100vh"><button onclick="pay()">Pay now</button>
<script>
function pay() {
  document.body.style.background = 'rgb(0,160,0)';
  document.body.insertAdjacentHTML('beforeend', '<h1 id=state>Paid</h1>');
  setTimeout(() => {
    document.body.style.background = 'rgb(200,0,0)';
    document.getElementById('state').textContent = 'Redirecting';
  }, 400);
}
</script>""",
    # Painted the moment the document is parsed, then more once it is loaded.
    "/paint-after-load": """<!doctype html><title>Ready</title>
<body style="margin:0;height:100vh;background:rgb(0,0,200)">
<script>
addEventListener('DOMContentLoaded', () =>
  setTimeout(() => document.body.insertAdjacentHTML('beforeend', '<h1>Loaded</h1>'), 0));
</script>""",
    # Never still: a spinner beside the button the step clicks.
    "/endless": """<!doctype html><title>Busy</title>
<style>@keyframes spin { to { transform: rotate(360deg) } }
.spinner { width: 40px; height: 40px; border: 6px solid #888; border-top-color: #06c;
  border-radius: 50%; animation: spin .6s linear infinite }</style>
<div class=spinner role=progressbar aria-label=Working></div>
<button onclick="document.body.insertAdjacentHTML('beforeend', '<p>Continued</p>')">
Continue</button>""",
    # A second page, opened by the first: both are drawn, one frame at a time.
    "/opener": """<!doctype html><title>Opener</title>
<a href="/raf-button" target="_blank">Open the form</a>""",
    # A dialog opened from an animation frame: the frame that runs it waits for its answer.
    "/raf-dialog": """<!doctype html><title>Save</title><main>
<button onclick="requestAnimationFrame(() => { alert('Saved'); document.querySelector('main')
  .insertAdjacentHTML('beforeend', '<h2>Done</h2>'); })">Save</button></main>""",
    # The button exists only after two animation frames.
    "/raf-button": """<!doctype html><title>Later</title><main></main>
<script>
requestAnimationFrame(() => requestAnimationFrame(() => {
  const b = document.createElement('button');
  b.textContent = 'Ready to go';
  b.onclick = () => document.querySelector('main').insertAdjacentHTML('beforeend', '<h2>Gone</h2>');
  document.querySelector('main').append(b);
}));
</script>""",
}


class _Pages(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = PAGES.get(self.path.split("?")[0])
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.end_headers()
        self.wfile.write((body or "not here").encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


@contextlib.contextmanager
def sandbox_url(site: str, tmp_path: Path, *, begin_frame: str) -> Iterator[str]:
    config = replace(settings.ENGINE_CONFIG, begin_frame=begin_frame)
    backend = LocalBackend(config)
    with EgressProxy(
        EgressPolicy([site.removeprefix("http://")]), on_denied=lambda attempt: None
    ) as proxy:
        sandbox = backend.create(
            SandboxSpec(
                run_key=f"frames-{begin_frame}-{tmp_path.name[-8:]}",
                proxy_url=proxy.url,
                ttl_seconds=120,
            )
        )
        try:
            drawn = BEGIN_FRAME if begin_frame == "auto" else FREE_RUNNING
            assert sandbox.details["frames"] == drawn
            yield sandbox.cdp_url
            # Two frames at once for two pages kill the GPU process (see frames).
            log = (Path(sandbox.workdir) / "chromium.log").read_text(errors="replace")
            assert "GPU process exited" not in log
        finally:
            backend.destroy(sandbox)


@pytest.fixture
def drawn_on_request(site: str, tmp_path: Path) -> Iterator[str]:
    chromium = find_chromium(settings.ENGINE_CONFIG.chromium) or ""
    if not is_headless_shell(chromium):
        pytest.skip(f"{chromium or 'no Chromium'} cannot draw on request: not the headless shell")
    with sandbox_url(site, tmp_path, begin_frame="auto") as cdp_url:
        yield cdp_url


class Sink:
    def __init__(self) -> None:
        self.records: list[Any] = []

    def step_finished(self, record: Any) -> None:
        recording.finish(record)
        self.records.append(record)

    def action_starting(self, index: int) -> None: ...

    def action_finished(self, index: int, result: str = "") -> None: ...

    def action_refused(self, index: int, reason: str) -> None: ...

    def stop_reason(self) -> str | None:
        return None


def run(cdp_url: str, steps: list[dict[str, Any]], tmp_path: Path) -> dict[str, Any]:
    plan = RunPlan(
        steps=steps,
        inputs={},
        secrets={},
        step_budget=20,
        deadline=time.time() + 60,
        artifacts_dir=tmp_path / "artifacts",
    )
    sink = Sink()
    outcome = Runner(plan, sink).run(cdp_url)
    errors = [(record.step_id, record.error) for record in sink.records]
    assert outcome.status == "succeeded", (outcome.reason, errors)
    return {r.step_id: r for r in sink.records}


def colour_at_centre(jpeg: bytes) -> tuple[int, int, int]:
    image = Image.open(io.BytesIO(jpeg)).convert("RGB")
    pixel = image.getpixel((image.width // 2, image.height // 2))
    assert isinstance(pixel, tuple)
    return (pixel[0], pixel[1], pixel[2])


def close_to(colour: tuple[int, int, int], want: tuple[int, int, int]) -> bool:
    return all(abs(a - b) <= 24 for a, b in zip(colour, want, strict=True))


def shown_text(record: Any) -> str:
    return json.dumps(record.observation)


def test_a_page_that_changes_right_after_a_step_keeps_the_step_s_state_in_its_picture(
    drawn_on_request: str, site: str, tmp_path: Path
) -> None:
    records = run(
        drawn_on_request,
        [
            {"id": "open", "type": "goto", "url": f"{site}/change-after"},
            {"id": "pay", "type": "click", "target": {"role": "button", "name": "Pay now"}},
            {"id": "paid", "type": "wait_for", "text": "Paid"},
        ],
        tmp_path,
    )

    for step in ("pay", "paid"):
        assert close_to(colour_at_centre(records[step].screenshot), GREEN), step
        assert "Paid" in shown_text(records[step])
        assert "Redirecting" not in shown_text(records[step])


def test_a_page_that_paints_right_after_a_navigation_is_pictured_painted(
    drawn_on_request: str, site: str, tmp_path: Path
) -> None:
    records = run(
        drawn_on_request,
        [
            {"id": "open", "type": "goto", "url": f"{site}/paint-after-load"},
            {"id": "loaded", "type": "wait_for", "text": "Loaded"},
        ],
        tmp_path,
    )

    assert close_to(colour_at_centre(records["open"].screenshot), BLUE)
    assert close_to(colour_at_centre(records["loaded"].screenshot), BLUE)
    assert "Loaded" in shown_text(records["loaded"])


def test_an_endless_animation_neither_hangs_a_step_nor_its_picture(
    drawn_on_request: str, site: str, tmp_path: Path
) -> None:
    records = run(
        drawn_on_request,
        [
            {"id": "open", "type": "goto", "url": f"{site}/endless"},
            {"id": "go-on", "type": "click", "target": {"role": "button", "name": "Continue"}},
            {"id": "done", "type": "wait_for", "text": "Continued"},
        ],
        tmp_path,
    )

    assert all(record.screenshot for record in records.values())
    assert not any(record.error for record in records.values())


def test_a_button_shown_only_after_animation_frames_is_clicked(
    drawn_on_request: str, site: str, tmp_path: Path
) -> None:
    records = run(
        drawn_on_request,
        [
            {"id": "open", "type": "goto", "url": f"{site}/raf-button"},
            {"id": "go", "type": "click", "target": {"role": "button", "name": "Ready to go"}},
            {"id": "gone", "type": "wait_for", "text": "Gone"},
        ],
        tmp_path,
    )

    assert "Gone" in shown_text(records["gone"])


def test_a_page_opened_by_another_is_drawn_too(
    drawn_on_request: str, site: str, tmp_path: Path
) -> None:
    records = run(
        drawn_on_request,
        [
            {"id": "open", "type": "goto", "url": f"{site}/opener"},
            {"id": "new-tab", "type": "click", "target": {"role": "link", "name": "Open the form"}},
            {"id": "go", "type": "click", "target": {"role": "button", "name": "Ready to go"}},
            {"id": "gone", "type": "wait_for", "text": "Gone"},
        ],
        tmp_path,
    )

    assert records["gone"].url.endswith("/raf-button")
    assert records["gone"].screenshot


def test_a_dialog_opened_in_an_animation_frame_is_answered_and_the_step_pictured(
    drawn_on_request: str, site: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    records = run(
        drawn_on_request,
        [
            {"id": "open", "type": "goto", "url": f"{site}/raf-dialog"},
            {
                "id": "save",
                "type": "click",
                "target": {"role": "button", "name": "Save"},
                "dialog": "accept",
            },
            {"id": "done", "type": "wait_for", "text": "Done"},
        ],
        tmp_path,
    )

    assert not any(record.error for record in records.values())
    assert records["done"].screenshot
    # Answered as it came, not at a picture's deadline (10 s).
    assert time.monotonic() - started < 8


def test_the_live_view_and_the_runner_draw_one_frame_at_a_time(
    drawn_on_request: str, site: str
) -> None:
    # The tap and every connection of the runner share the process's pump: connections coming
    # and going while the tap casts a browser with two pages never put two frames in flight.
    def two_pages(browser: Any) -> None:
        browser.contexts[0].pages[0].goto(f"{site}/endless")
        browser.contexts[0].new_page().goto(f"{site}/endless")

    with_browser(drawn_on_request, two_pages)

    async def cast_while_connecting() -> int:
        shown: list[Frame] = []

        async def on_frame(frame: Frame) -> None:
            shown.append(frame)

        tap = BrowserTap(drawn_on_request, secret_values=[], secret_fields=[], on_frame=on_frame)
        await tap.open()
        try:
            await tap.start(fps=10)
            for _ in range(12):
                await asyncio.to_thread(with_browser, drawn_on_request, lambda browser: None)
            await asyncio.sleep(0.3)
        finally:
            await tap.close()
        return len(shown)

    # On a thread of its own: a sync Playwright of this session may hold this thread's loop. A
    # daemon, waited for a bounded time: a cast that never ends fails this test instead of
    # holding the whole suite.
    shown: list[int] = []
    apart = threading.Thread(
        target=lambda: shown.append(asyncio.run(cast_while_connecting())), daemon=True
    )
    apart.start()
    apart.join(timeout=120)
    assert not apart.is_alive(), "casting while connecting did not end within 2 minutes"
    assert len(shown) == 1
    assert shown[0] > 0


def test_only_a_browser_that_draws_on_request_gets_a_pump_and_it_draws_only_while_connected(
    drawn_on_request: str, site: str, tmp_path: Path
) -> None:
    def frames_while_connected(browser: Any) -> tuple[bool, int]:
        pump = frames(browser)
        assert pump is not None
        page = browser.contexts[0].pages[0]
        page.goto(f"{site}/endless")
        before = pump.frames_drawn()
        page.wait_for_timeout(300)
        return page.evaluate("document.title") == "Busy", pump.frames_drawn() - before

    loaded, drawn = with_browser(drawn_on_request, frames_while_connected)

    assert loaded
    # Display pace is 60 a second; a loaded machine draws fewer, but never none.
    assert 3 <= drawn <= 30
    with sandbox_url(site, tmp_path, begin_frame="off") as free:
        assert FramePump.open(free) is None


def test_the_browser_is_named_in_words_from_what_it_says_of_itself() -> None:
    assert (
        browser_label("HeadlessChrome/156.0.8078.114") == "Chromium headless shell 156.0.8078.114"
    )
    assert browser_label("Chrome/156.0.8078.114") == (
        "Chromium 156.0.8078.114 (headless mode of the desktop browser)"
    )
    assert browser_label("Firefox/140.0") == "Firefox/140.0"
