"""A pytest plugin (``-p pandaweb.testing`` in pyproject.toml): the test run is an entry point like
manage.py, so it creates the embedded default's key files before pytest-django reads the
settings, which only read them.

On the real-services pass each pytest-xdist process gets a Redis database of its own: its test
database's run ids start at 1 like the other's, and the channel layer's groups, the Celery
queues and the API's rate windows are named after those ids, so two processes on one Redis
database would hear each other's runs."""

from __future__ import annotations

import os
import re

from pandaweb.localfiles import ensure_local_files

ensure_local_files()


def redis_url_for_test_process(url: str, worker: str) -> str:
    """``redis://host:port/1`` for process ``gw0``, ``…/2`` for ``gw1``, and so on."""
    match = re.fullmatch(r"(redis://[^/]+)(?:/(\d+))?", url)
    if match is None or not worker.startswith("gw"):
        return url
    base_db = int(match.group(2) or 0)
    return f"{match.group(1)}/{base_db + int(worker[2:])}"


_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker and os.environ.get("REDIS_URL"):
    os.environ["REDIS_URL"] = redis_url_for_test_process(os.environ["REDIS_URL"], _worker)
