"""How much smaller is our observation than Playwright's raw AI snapshot, and does it lose refs?

Run from the project root: ``.venv/bin/python bench/observation_size.py``.

Serves the demo portal and ``bench/pages/*.html`` on loopback, signs in, and for every page prints
the size of ``page.aria_snapshot(mode="ai")`` against ``observe(page)`` (chars and chars/4 tokens),
the ratio, and the share of the raw snapshot's interactive refs that our elements carry. The main
columns observe without an element cap so the comparison is like for like; the last two show the
default ``max_elements=400``. Every request that is not to loopback is aborted.
"""

from __future__ import annotations

import functools
import math
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

from pandaweb.browser import HEADLESS_ARGS, find_chromium  # noqa: E402
from pandaweb.demo_portal.server import make_server  # noqa: E402
from pandaweb.demo_portal.state import DEMO_PASSWORD, DEMO_USERNAME  # noqa: E402
from sessions.observation import interactive_refs, observe  # noqa: E402

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


def measure(page: Page, label: str) -> tuple[str, ...]:
    raw = page.aria_snapshot(mode="ai")
    started = time.perf_counter()
    ours = observe(page, max_elements=1_000_000)
    elapsed = (time.perf_counter() - started) * 1000
    capped = observe(page)
    wanted = interactive_refs(raw)
    have = {element.ref for element in ours.elements}
    have_capped = {element.ref for element in capped.elements}
    coverage = sum(ref in have for ref in wanted) / len(wanted) if wanted else 1.0
    coverage_capped = sum(ref in have_capped for ref in wanted) / len(wanted) if wanted else 1.0
    return (
        label,
        f"{len(raw):,}",
        f"{math.ceil(len(raw) / 4):,}",
        f"{ours.size_chars:,}",
        f"{ours.token_estimate:,}",
        f"{ours.size_chars / len(raw):.0%}",
        f"{coverage:.0%}",
        f"{len(wanted)}",
        f"{len(ours.elements)}",
        f"{elapsed:.0f}",
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
        "raw refs",
        "elements",
        "ms",
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
            executable_path=find_chromium(), args=list(HEADLESS_ARGS), headless=True
        )
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.route("**/*", loopback_only)
        sign_in(page, portal)
        for path in PORTAL_PATHS:
            page.goto(f"{portal}{path}")
            if path == "/lab/late-content":
                page.get_by_role("button", name="Export statistics").wait_for()
            rows.append(measure(page, path))
        for html in sorted(PAGES_DIR.glob("*.html")):
            page.goto(f"{static}/{html.name}")
            rows.append(measure(page, f"bench/pages/{html.name}"))
        browser.close()
    print_table(rows)
    print(
        "\nraw = page.aria_snapshot(mode='ai'); ours = observe(page).text without a cap; "
        "tokens = chars/4 rounded up;\ncoverage = share of the raw snapshot's interactive refs "
        "(control roles or cursor=pointer) present in ours."
    )


if __name__ == "__main__":
    main()
