"""Our observation against Playwright's AI snapshot: size, coverage, and what each costs to take.

Run from the project root: ``.venv/bin/python bench/observation_size.py [--rounds 3]``.

Serves the demo portal and ``bench/pages/*.html`` on loopback, signs in, and for every page
(the portal's, its dense lab pages — a 1,000-row table, a 300-card grid, a 400-link menu — and
the static ones) prints:

- the size of ``page.aria_snapshot(mode="ai")`` against ``observe(page)`` (chars and chars/4
  tokens) and the ratio; the observation has no element cap (stored evidence is complete), the
  last two columns show what a model would read with ``max_elements=400``;
- coverage: the share of the controls (role and name) Playwright's snapshot lists that our
  observation lists too;
- time, median of ``--rounds`` rounds that alternate the two (aria, ours, aria, ours …):
  ``aria`` is ``page.aria_snapshot(mode="ai")``; ``aria+box`` the same with ``boxes=True`` (what
  the runner took before); ``take`` is what the runner takes on its path now
  (``observation.take`` in the page's isolated world, the world already made by the step's
  change mark as in a run); ``build`` is what the writer does with it, off the runner's path.

Every request that is not to loopback is aborted. The machine's CPUs and load are printed.
"""

from __future__ import annotations

import argparse
import collections
import functools
import math
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from playwright.sync_api import Page, Route, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _harness import engine_config, load_line  # noqa: E402

from pandaweb.demo_portal.server import make_server  # noqa: E402
from pandaweb.demo_portal.state import DEMO_PASSWORD, DEMO_USERNAME  # noqa: E402
from sessions.engine.chromium import HEADLESS_ARGS, find_chromium  # noqa: E402
from sessions.engine.observation import PageWatch, observe, take  # noqa: E402
from sessions.engine.reading import interactive_controls  # noqa: E402

PAGES_DIR = Path(__file__).resolve().parent / "pages"
PORTAL_PATHS = (
    "/",
    "/invoices",
    "/invoices/INV-1001",
    "/invoices/INV-1001/pay",
    "/invoices/INV-1009/pay",
    "/lab/late-content",
    "/lab/modal",
    "/lab/iframe",
    "/lab/shadow",
    "/lab/dropdown",
    "/lab/injection",
    "/lab/external",
    "/lab/mega-menu",
    "/lab/products",
    "/lab/transactions",
)
DEFAULT_CAP = 400


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def serving(server: ThreadingHTTPServer) -> Iterator[str]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def loopback_only(route: Route) -> None:
    url = route.request.url
    if url.startswith(("http://127.0.0.1:", "data:")):
        route.continue_()
    else:
        route.abort()


def sign_in(page: Page, portal: str) -> None:
    page.goto(f"{portal}/login")
    page.get_by_label("Username").fill(DEMO_USERNAME)
    page.get_by_label("Password").fill(DEMO_PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{portal}/")
    page.get_by_role("button", name="Accept").click()


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def measure(page: Page, label: str, rounds: int) -> tuple[str, ...]:
    watch = PageWatch(page)
    watch.mark()
    timings: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(rounds):
        started = time.perf_counter()
        raw = page.aria_snapshot(mode="ai")
        timings["aria"].append(_ms(started))
        started = time.perf_counter()
        taken = take(page, watch=watch)
        timings["take"].append(_ms(started))
        started = time.perf_counter()
        ours = taken.build()
        timings["build"].append(_ms(started))
        started = time.perf_counter()
        page.aria_snapshot(mode="ai", boxes=True)
        timings["aria+box"].append(_ms(started))
    watch.close()
    capped = observe(page, max_elements=DEFAULT_CAP)
    wanted = collections.Counter(interactive_controls(raw))
    have = collections.Counter((e.role, e.name) for e in ours.elements if e.interactive)
    have_capped = collections.Counter((e.role, e.name) for e in capped.elements if e.interactive)
    total = sum(wanted.values())
    coverage = sum((wanted & have).values()) / total if total else 1.0
    coverage_capped = sum((wanted & have_capped).values()) / total if total else 1.0
    median = {key: statistics.median(values) for key, values in timings.items()}
    return (
        label,
        f"{len(raw):,}",
        f"{math.ceil(len(raw) / 4):,}",
        f"{ours.size_chars:,}",
        f"{ours.token_estimate:,}",
        f"{ours.size_chars / len(raw):.0%}",
        f"{coverage:.0%}",
        f"{total}",
        f"{len(ours.elements)}",
        f"{median['aria']:.0f}",
        f"{median['aria+box']:.0f}",
        f"{median['take']:.0f}",
        f"{median['build']:.0f}",
        f"{capped.size_chars:,}",
        f"{coverage_capped:.0%}",
    )


def print_table(rows: list[tuple[str, ...]]) -> None:
    header = (
        "page",
        "raw chars",
        "raw tok",
        "ours chars",
        "ours tok",
        "ours/raw",
        "coverage",
        "controls",
        "elements",
        "aria ms",
        "aria+box ms",
        "take ms",
        "build ms",
        "@400 chars",
        "@400 cov",
    )
    widths = [max(len(row[index]) for row in (header, *rows)) for index in range(len(header))]
    line = "| " + " | ".join(cell.ljust(width) for cell, width in zip(header, widths, strict=True))
    print(line + " |")
    print("|" + "|".join("-" * (width + 2) for width in widths) + "|")
    for row in rows:
        cells = [
            cell.ljust(width) if index == 0 else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        print("| " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per page (median)")
    rounds = parser.parse_args().rounds
    print(f"machine: {load_line()} at start")
    portal_server = make_server("127.0.0.1", 0)
    handler = functools.partial(_QuietHandler, directory=str(PAGES_DIR))
    pages_server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    rows: list[tuple[str, ...]] = []
    with (
        serving(portal_server) as portal,
        serving(pages_server) as static,
        sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(
            executable_path=find_chromium(engine_config().chromium),
            args=list(HEADLESS_ARGS),
            headless=True,
        )
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.route("**/*", loopback_only)
        sign_in(page, portal)
        for path in PORTAL_PATHS:
            page.goto(f"{portal}{path}")
            if path == "/lab/late-content":
                page.get_by_role("button", name="Export statistics").wait_for()
            rows.append(measure(page, path, rounds))
        for html in sorted(PAGES_DIR.glob("*.html")):
            page.goto(f"{static}/{html.name}")
            rows.append(measure(page, f"bench/pages/{html.name}", rounds))
        browser.close()
    print_table(rows)
    print(
        "\nraw = page.aria_snapshot(mode='ai'); ours = observe(page).text without a cap; "
        "tokens = chars/4 rounded up;\ncoverage = share of the raw snapshot's controls "
        "(control roles or cursor=pointer; role and name) listed in ours;\n"
        f"times: median of {rounds} alternating rounds; {load_line()} at the end."
    )


if __name__ == "__main__":
    main()
