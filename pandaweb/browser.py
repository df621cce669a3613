"""Locating and launching the system Chromium (no Django imports).

The product never downloads a browser: it uses the one the machine has, which the set-up script
installs from the distribution when it is missing.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# Headless Chromium on a machine without outside network: background services would otherwise
# try (and fail) to reach Google hosts at every start.
HEADLESS_ARGS: tuple[str, ...] = (
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--disable-dev-shm-usage",
)

_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """Return the path of the Chromium to drive, or None to let Playwright use its own build.

    ``PANDAWEB_CHROMIUM`` wins when set; it must name an executable file.
    """
    configured = os.environ.get("PANDAWEB_CHROMIUM", "").strip()
    if configured:
        if not (Path(configured).is_file() and os.access(configured, os.X_OK)):
            raise FileNotFoundError(f"PANDAWEB_CHROMIUM={configured!r} is not an executable file")
        return configured
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None
