"""The live view's own CDP client, against a real Chromium: frames masked like step screenshots,
a person's clicks and keys reaching the page, keys refused in a secret field."""

from __future__ import annotations

import asyncio
import contextlib
import io
import shutil
import subprocess
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests
from django.conf import settings
from PIL import Image
from playwright.sync_api import Page, Playwright

from sessions.engine.chromium import HEADLESS_ARGS, find_chromium, launch_args
from sessions.engine.screencast import (
    MASK_COLOUR,
    UNREADABLE_DIALOG,
    BrowserTap,
    Dialog,
    Frame,
    mask_frame,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]
T = TypeVar("T")

SECRET = "s3cret-Token-4242"
PAGE = f"""<!doctype html><title>Sign in</title>
<style>body {{ margin: 0; font: 20px sans-serif; }} input {{ font: 20px monospace; width: 400px; }}
#tall {{ height: 1500px; }}</style>
<label for="user">Username</label> <input id="user" value="olivia">
<p><label for="token">API token</label> <input id="token" value="{SECRET}"></p>
<p><label for="pw">Password</label> <input id="pw" type="password" value="hunter2"></p>
<p><label for="otp">One-time code</label> <input id="otp"></p>
<button id="go" style="width: 300px; height: 120px"
  onclick="document.title = 'clicked'">Go</button>
<div id="tall"></div>"""


@contextlib.contextmanager
def launched_chromium(profile: Path, url: str, *, desktop: bool = False) -> Iterator[str]:
    """A headless Chromium showing ``url``, with no CDP client attached yet; its CDP address.
    ``desktop``: the desktop Chromium in its headless mode, not the headless shell."""
    binary = shutil.which("chromium") if desktop else find_chromium(settings.ENGINE_CONFIG.chromium)
    if binary is None:
        pytest.skip("no such Chromium on this machine")
    process = subprocess.Popen(
        [binary, *launch_args(binary, begin_frame=False), *HEADLESS_ARGS,
         "--remote-debugging-port=0",
         f"--user-data-dir={profile}", "--window-size=1000,700", url],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 20
    while not port_file.is_file() or not port_file.read_text().strip():
        assert time.monotonic() < deadline, "Chromium did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port_file.read_text().split()[0]}"
    finally:
        process.kill()
        process.wait()


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[str]:
    with launched_chromium(tmp_path / "profile", "about:blank") as cdp_url:
        yield cdp_url


@pytest.fixture
def page(chromium: str, playwright_instance: Playwright) -> Iterator[Page]:
    # The session's Playwright: a second sync instance in this thread finds the first one's loop.
    browser = playwright_instance.chromium.connect_over_cdp(chromium)
    page = browser.contexts[0].pages[0]
    page.set_content(PAGE)
    yield page
    browser.close()


def run_apart(work: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``work`` on a loop of another thread: sync Playwright holds this thread's."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(work())).result()


def make_tap(chromium: str, frames: list[Frame], **kwargs: object) -> BrowserTap:
    async def keep(frame: Frame) -> None:
        frames.append(frame)

    return BrowserTap(
        chromium,
        secret_values=[SECRET],
        secret_fields=[{"label": "One-time code"}],
        on_frame=keep,
        **kwargs,  # type: ignore[arg-type]
    )


async def wait_for(frames: list[Frame], count: int) -> None:
    deadline = time.monotonic() + 15
    while len(frames) < count:
        assert time.monotonic() < deadline, "no frame came"
        await asyncio.sleep(0.02)


def pixel(frame: Frame, x: float, y: float) -> tuple[int, int, int]:
    image = Image.open(io.BytesIO(frame.jpeg)).convert("RGB")
    scale = image.width / frame.device_width
    return image.getpixel((int(x * scale), int(y * scale)))  # type: ignore[return-value]


def close_to(colour: tuple[int, int, int], wanted: tuple[int, int, int]) -> bool:
    return all(abs(a - b) <= 40 for a, b in zip(colour, wanted, strict=True))


def test_a_frame_paints_over_passwords_secret_values_and_the_workflows_secret_fields(
    chromium: str, page: Page
) -> None:
    boxes = {
        name: page.locator(f"#{name}").bounding_box() for name in ("user", "token", "pw", "otp")
    }
    frames: list[Frame] = []

    async def work() -> None:
        tap = make_tap(chromium, frames)
        await tap.open()
        try:
            await tap.start(fps=5)
            await wait_for(frames, 1)
        finally:
            await tap.close()

    run_apart(work)
    frame = frames[-1]
    assert frame.masks == 3
    for name in ("token", "pw", "otp"):
        box = boxes[name]
        assert box is not None
        middle = pixel(frame, box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        assert close_to(middle, MASK_COLOUR), name
    user = boxes["user"]
    assert user is not None
    assert not close_to(pixel(frame, user["x"] + 5, user["y"] + user["height"] / 2), MASK_COLOUR)


def test_a_mask_follows_its_field_with_the_frames_own_scroll_offset() -> None:
    image = Image.new("RGB", (500, 350), (255, 255, 255))
    out = io.BytesIO()
    image.save(out, format="JPEG")
    # Half-size frame of a page scrolled down by 100 CSS pixels: a field at y=150 of the
    # document is 50 pixels from the top of the view, 25 in the frame.
    metadata = {"deviceWidth": 1000, "deviceHeight": 700, "scrollOffsetY": 100, "timestamp": 1.0}
    frame = mask_frame(out.getvalue(), [[100, 150, 200, 40]], metadata)
    assert frame.masks == 1
    assert close_to(pixel(frame, 200, 70), MASK_COLOUR)
    assert not close_to(pixel(frame, 200, 20), MASK_COLOUR)


def test_a_frame_is_encoded_again_only_when_a_mask_lies_on_it() -> None:
    image = Image.new("RGB", (500, 350), (255, 255, 255))
    out = io.BytesIO()
    image.save(out, format="JPEG")
    metadata = {"deviceWidth": 1000, "deviceHeight": 700, "scrollOffsetY": 2000}

    # A secret field scrolled out of view: the browser's own bytes go on.
    above = mask_frame(out.getvalue(), [[100, 150, 200, 40]], metadata)
    # One on screen and one far below it: only the first is painted.
    both = mask_frame(out.getvalue(), [[100, 2150, 200, 40], [100, 9000, 200, 40]], metadata)

    assert (above.jpeg, above.masks) == (out.getvalue(), 0)
    assert both.masks == 1
    assert close_to(pixel(both, 200, 170), MASK_COLOUR)
    assert not close_to(pixel(both, 200, 260), MASK_COLOUR)


def test_a_persons_click_and_keys_reach_the_page_but_never_a_secret_field(
    chromium: str, page: Page
) -> None:
    go = page.locator("#go").bounding_box()
    assert go is not None

    async def work() -> tuple[str, str]:
        tap = make_tap(chromium, [])
        await tap.open()
        try:
            await tap.click(go["x"] + 20, go["y"] + 20)
            page_focus_user = await tap.call(
                "Runtime.evaluate",
                {"expression": "document.getElementById('user').focus()"},
                session=tap._session,
            )
            assert "exceptionDetails" not in page_focus_user
            plain = (await tap.secret_fields_now())["focus"]
            await tap.key("x")
            await tap.call(
                "Runtime.evaluate",
                {"expression": "document.getElementById('otp').focus()"},
                session=tap._session,
            )
            secret = (await tap.secret_fields_now())["focus"]
            return plain, secret
        finally:
            await tap.close()

    plain, secret = run_apart(work)
    assert page.title() == "clicked"
    assert "x" in page.locator("#user").input_value()
    assert (plain, secret) == ("", "secret")


def test_a_dialog_already_open_when_the_tap_attaches_is_shown_answered_then_cast(
    tmp_path: Path,
) -> None:
    # Chromium keeps Page.enable unanswered behind a dialog it opened before anyone listened,
    # never names it and cannot answer it: the tap must neither hang nor give up, but show a
    # dialog it cannot read, whose answer (a reload) brings the page back, asking again.
    url = (
        "data:text/html,<script>document.title = 'asking';"
        "document.title = confirm('Leave?') ? 'left' : 'stayed'</script>"
    )
    # The desktop Chromium: the headless shell dismisses a dialog that opens while no client is
    # attached, so there it is never found open.
    with launched_chromium(tmp_path / "profile", url, desktop=True) as cdp_url:
        # The title comes before the dialog, in order, from the same script.
        deadline = time.monotonic() + 15

        def titles() -> list[str]:
            return [t["title"] for t in requests.get(f"{cdp_url}/json/list", timeout=5).json()]

        while "asking" not in titles():
            assert time.monotonic() < deadline, "the page did not start asking"
            time.sleep(0.02)

        async def work() -> tuple[float, list[Dialog | None], str]:
            frames: list[Frame] = []
            seen: list[Dialog | None] = []
            tap = make_tap(cdp_url, frames, on_dialog=seen.append)
            try:
                started = time.monotonic()
                await tap.open()
                await tap.start(fps=5)
                attached_in = time.monotonic() - started
                assert tap.dialog is UNREADABLE_DIALOG
                await tap.answer_dialog(accept=True)
                deadline = time.monotonic() + 15
                while tap.dialog is None:  # the reloaded page asks again, readably this time
                    assert time.monotonic() < deadline, "the reloaded page did not ask again"
                    await asyncio.sleep(0.02)
                await tap.answer_dialog(accept=True)
                await wait_for(frames, 1)  # the cast started once the page answered
                title = await tap.call(
                    "Runtime.evaluate",
                    {"expression": "document.title", "returnByValue": True},
                    session=tap._session,
                )
                return attached_in, seen, title["result"]["value"]
            finally:
                await tap.close()

        attached_in, seen, title = run_apart(work)

    assert attached_in < 8
    assert seen[0] is UNREADABLE_DIALOG
    assert seen[1] == Dialog(kind="confirm", message="Leave?")
    assert title == "left"
