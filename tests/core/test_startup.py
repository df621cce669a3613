"""A web process that does not execute runs (daphne beside Celery workers, a management command)
never loads the workers' side: Playwright and the runner belong to the processes that run
browsers, the model's client (the openai SDK) to the processes that ask the model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOT_IN_WEB_PROCESS = (
    "playwright.sync_api",
    "sessions.engine.runner",
    "sessions.services.execution",
    "sessions.services.baking",
    "openai",
    "pandaweb.assist.calling",
)
PROBE = f"""
import json, sys
import django
django.setup()
from django.urls import resolve
import pandaweb.asgi, pandaweb.api.api
resolve("/")
print(json.dumps([name for name in {NOT_IN_WEB_PROCESS!r} if name in sys.modules]))
"""


def test_starting_the_web_side_loads_no_browser_and_no_model_client() -> None:
    clean = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        # A web process of a scale-out installation: runs execute in Celery workers. The URL is
        # only read, never connected to.
        env={
            **clean,
            "DJANGO_SETTINGS_MODULE": "pandaweb.settings",
            "REDIS_URL": "redis://127.0.0.1:6379/15",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
