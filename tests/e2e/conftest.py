"""A real installation for end-to-end tests: `manage.py up` with daphne (and a Celery worker
process when REDIS_URL is set) on its own database, driven by a real Chromium."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
import yaml
from playwright.sync_api import Page, expect
from psycopg import sql

from pandaweb.supervisor import url_answers
from tests.sessions.fake_model import FakeModel, fake_model_server

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Stack:
    url: str
    portal_url: str
    env: dict[str, str]
    logins: dict[str, str]
    scale_out: bool
    log_path: Path

    def log_tail(self, lines: int = 150) -> str:
        """The end of the stack's own output (dashboard, workers, portal), for failures."""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def manage(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout


def workflow_import_and_publish(page: Page, stack: Stack, document: dict[str, Any]) -> None:
    """Import ``document`` (a workflow file's content, its ``slug`` new to the stack) through
    the dashboard and publish it as version 1, as the person logged in on ``page``; returns once
    the dashboard says it is published, on the workflow's page."""
    page.goto(f"{stack.url}/workflows/import/")
    page.get_by_label("File").set_input_files(
        files={
            "name": f"{document['slug']}.yaml",
            "mimeType": "application/yaml",
            "buffer": yaml.safe_dump(document).encode(),
        }
    )
    page.get_by_role("button", name="Import").click()
    page.get_by_label("What changed").fill("first version")
    page.get_by_role("button", name="Publish version 1").click()
    expect(page.get_by_text("Published version 1")).to_be_visible()


@pytest.fixture(scope="session")
def e2e_database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The stack's own database: SQLite by default, a fresh PostgreSQL one with DATABASE_URL."""
    base = os.environ.get("DATABASE_URL", "")
    if not base.startswith("postgres"):
        yield f"sqlite:///{tmp_path_factory.mktemp('e2e-db') / 'pandaweb.sqlite3'}"
        return
    name = f"pandaweb_e2e_{secrets.token_hex(4)}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield base.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture(scope="session")
def fake_model() -> Iterator[tuple[FakeModel, str]]:
    """The stack's model for healing: a fake chat API on loopback (no real one is reachable)."""
    with fake_model_server() as served:
        yield served


@pytest.fixture(scope="session")
def live_stack(
    tmp_path_factory: pytest.TempPathFactory,
    e2e_database_url: str,
    fake_model: tuple[FakeModel, str],
) -> Iterator[Stack]:
    data_dir = tmp_path_factory.mktemp("e2e-data")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    env |= {
        "DATABASE_URL": e2e_database_url,
        "PANDAWEB_DATA_DIR": str(data_dir),
        "PANDAWEB_CELERY_QUEUE": f"e2e-{secrets.token_hex(4)}",
        "PANDAWEB_ASSIST_URL": fake_model[1],
        "PANDAWEB_ASSIST_MODEL": "fake-model",
        # Launches may name a callback on loopback, where the tests' receivers listen.
        "PANDAWEB_CALLBACK_HOSTS": "127.0.0.1",
        "PYTHONUNBUFFERED": "1",
    }
    scale_out = bool(env.get("REDIS_URL"))
    port, portal_port = free_port(), free_port()
    env["PANDAWEB_DEMO_PORTAL_URL"] = f"http://127.0.0.1:{portal_port}/"
    env["PANDAWEB_SANDBOX_DIR"] = str(data_dir / "sandboxes")
    stack = Stack(
        url=f"http://127.0.0.1:{port}",
        portal_url=f"http://127.0.0.1:{portal_port}",
        env=env,
        logins={},
        scale_out=scale_out,
        log_path=data_dir / "up.log",
    )
    stack.manage("migrate", "--no-input", "-v0")
    stack.manage("setup_roles", "--demo-users")
    stack.logins = json.loads((data_dir / "demo-logins.json").read_text())

    log = (data_dir / "up.log").open("w")
    up = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 90
    while not (url_answers(f"{stack.url}/login/") and url_answers(f"{stack.portal_url}/login")):
        if up.poll() is not None or time.monotonic() > deadline:
            up.kill()
            raise RuntimeError("the stack did not start:\n" + (data_dir / "up.log").read_text())
        time.sleep(0.3)
    if scale_out:
        wait_for_log(data_dir / "up.log", "ready.", up)
    children = psutil.Process(up.pid).children(recursive=True)
    try:
        yield stack
    finally:
        up.send_signal(signal.SIGTERM)
        code = up.wait(timeout=30)
        log.close()
        survivors = [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert code == 0, (data_dir / "up.log").read_text()
        assert survivors == [], f"processes outlived `up`: {survivors}"


@pytest.fixture
def stack(live_stack: Stack) -> Stack:
    """The running stack, its demo portal reset: every test pays from the same open invoices, so
    one test's payment must not leave the next one an invoice with nothing due."""
    request = urllib.request.Request(f"{live_stack.portal_url}/api/reset", method="POST")  # noqa: S310
    with urllib.request.urlopen(request, timeout=10):  # noqa: S310 (our own loopback portal)
        pass
    return live_stack


def wait_for_log(path: Path, needle: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while needle not in path.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"never saw {needle!r}:\n{path.read_text()}")
        time.sleep(0.3)
