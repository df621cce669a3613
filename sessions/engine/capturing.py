"""What a step leaves of the page: the snapshot, the masked screenshot, the elements the overlay
is drawn from, taken once the page is quiet (or marked incomplete, saying why)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Locator, Page

from sessions.engine import observation as observing
from sessions.engine import wording
from sessions.engine.frames import FramesError
from sessions.engine.steps.base import StepFailed, StepRecord

if TYPE_CHECKING:
    from sessions.engine.runner import Runner

SCREENSHOT_QUALITY = 85


@dataclass(frozen=True)
class Seen:
    """The evidence of the last step, and the page's change mark when it was taken."""

    page: Page
    mark: str | None
    taken: observing.Snapshot
    screenshot: bytes | None


def capture(runner: Runner, record: StepRecord, *, touched_page: bool, watch: bool = True) -> None:
    """Take the step's evidence: only what must be read at this instant (the serialised
    page, the masks, the picture). The numbered observation is built later by the writer
    (``sessions.engine.recording.finish``), off the runner's path."""
    try:
        page = runner.page
        page.wait_for_load_state("domcontentloaded", timeout=runner._scaled(5_000))
    except (StepFailed, PlaywrightError):
        return
    try:
        watcher = page_watch(runner, page)
        mark = watcher.mark() if watch else None
        last = runner._last_capture
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
        for attempt in range(2):
            taken = observing.take(page, secret_values=runner.secret_values, watch=watcher)
            record.url = page.url
            record.title = taken.shown_title
            record.pending = taken
            record.screenshot = _picture(runner, page, watcher, taken, touched_page)
            if mark is None or attempt:
                break
            # The page changed while it was read or pictured (a timer, a response arriving):
            # read and picture it once more, so the picture shows what the observation says.
            again = watcher.mark()
            if again == mark:
                break
            mark = again
        runner._last_capture = Seen(page=page, mark=mark, taken=taken, screenshot=record.screenshot)
    except (PlaywrightError, FramesError) as exc:
        runner._last_capture = None
        # Evidence that cannot be taken is said so, never faked.
        note = f"evidence incomplete: {wording.first_line(str(exc))}"
        record.error = f"{record.error}; {note}" if record.error else note


def _picture(
    runner: Runner,
    page: Page,
    watcher: observing.PageWatch,
    taken: observing.Snapshot,
    touched_page: bool,
) -> bytes | None:
    last = runner._last_capture
    if not touched_page and last is not None and last.taken.key == taken.key:
        # Same URL, controls, texts and layout as the last picture (a page whose
        # changes the watch cannot see, such as one with iframes): reuse the picture.
        return last.screenshot
    if taken.masks:
        return watcher.masked_screenshot(
            taken.mask_paths, quality=SCREENSHOT_QUALITY
        ) or page.screenshot(
            # Fields in frames, or fields that moved while the picture was taken: the
            # browser paints the masks itself.
            type="jpeg",
            quality=SCREENSHOT_QUALITY,
            caret="initial",
            mask=taken.masks,
            timeout=runner._scaled(10_000),
        )
    return watcher.screenshot(quality=SCREENSHOT_QUALITY)


def page_watch(runner: Runner, page: Page) -> observing.PageWatch:
    watcher = runner._watches.get(id(page))
    if watcher is None or watcher.page is not page:
        watcher = runner._watches[id(page)] = observing.PageWatch(page, frames=runner.frames)
    return watcher


def masks(runner: Runner, page: Page) -> list[Locator]:
    """What to hide in a picture of ``page`` now: the last evidence's masks when the page has
    not changed since it was taken, else those of a fresh look."""
    watcher = page_watch(runner, page)
    last = runner._last_capture
    if (
        last is not None
        and last.page is page
        and last.mark is not None
        and watcher.mark() == last.mark
    ):
        return last.taken.masks
    return observing.take(page, secret_values=runner.secret_values, watch=watcher).masks
