from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from playwright.sync_api import Browser, Page, Playwright, sync_playwright
from pytest_django.fixtures import Settings

from pandaweb.core.models import Team
from pandaweb.core.roles import Role
from pandaweb.demo_portal.server import PortalServer, make_server
from sessions.engine.chromium import HEADLESS_ARGS, find_chromium
from tests.factories import member_of, team_make, user_with_role

# Test modules import the ASGI application; as the embedded worker it would run housekeeping
# (reapers, schedules, webhook retries on timers) inside pytest against whatever test holds the
# database. Tests run that work themselves; servers they start as processes keep theirs.
settings.EMBEDDED_WORKER = False


@pytest.fixture(scope="session")
def playwright_instance() -> Iterator[Playwright]:
    with sync_playwright() as playwright:
        yield playwright


@pytest.fixture(scope="session")
def browser(playwright_instance: Playwright) -> Iterator[Browser]:
    """A real headless Chromium (the system one), shared by the session's browser tests."""
    browser = playwright_instance.chromium.launch(
        executable_path=find_chromium(settings.ENGINE_CONFIG.chromium),
        args=list(HEADLESS_ARGS),
        headless=True,
    )
    yield browser
    browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh browser context per test: no cookies or storage cross tests."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(10_000)
    yield page
    context.close()


@pytest.fixture(scope="session", autouse=True)
def every_module_imported_before_any_patch() -> None:
    """Import every view and task module once, before any test patches a function they bind.

    ``from pandaweb.core.dispatch import dispatch`` binds whatever the attribute is at import
    time; a module first imported inside a test that patched ``dispatch`` would keep that test's
    stand-in for the rest of the session (a later test's work would then silently never start).
    """
    from django.apps import apps
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 - imports every URLconf and its views
    for config in apps.get_app_configs():
        for module in ("tasks", "services"):
            if importlib.util.find_spec(f"{config.name}.{module}") is None:
                continue
            imported = importlib.import_module(f"{config.name}.{module}")
            # A services package's worker side (run execution, baking, the record writer) is
            # imported by tasks only, inside their bodies: import every part here.
            for part in pkgutil.iter_modules(getattr(imported, "__path__", [])):
                importlib.import_module(f"{imported.__name__}.{part.name}")


@pytest.fixture(autouse=True)
def fast_password_hashing(settings: Settings) -> None:
    """PBKDF2 is slow on purpose; tests only need hashes that verify."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def fresh_redis_channel_layer() -> Iterator[None]:
    """A Redis channel layer of its own for each test.

    channels_redis keeps one receive lock per layer instance, and an asyncio lock binds to the
    event loop that first waits on it. A test whose loop ends while a consumer receives leaves
    the lock held: the next test waiting on it times out, and every later one fails with "is
    bound to a different event loop". Messages go through Redis, so a fresh instance loses
    nothing; the in-memory layer is left alone (a live server in this process holds it).
    """
    yield
    if "channels_redis" in settings.CHANNEL_LAYERS["default"]["BACKEND"]:
        from channels.layers import channel_layers

        channel_layers.backends.pop("default", None)


@pytest.fixture(autouse=True)
def empty_append_only_tables(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a transactional test, empty the tables whose triggers refuse deletes.

    Django's flush (which runs next) deletes every row; the audit trail and published workflow
    versions refuse that by design, so they are emptied here with their triggers suspended.
    """
    yield
    marker = request.node.get_closest_marker("django_db")
    transactional = "transactional_db" in request.fixturenames or (
        marker is not None and marker.kwargs.get("transaction", False)
    )
    if not transactional:
        return
    from django.db import connection

    from approvals.models import ApprovalDecision, ApprovalRequest, Question
    from pandaweb.audit.models import AuditEvent
    from pandaweb.audit.triggers import append_only_suspended
    from sessions.models import Run
    from workflows.models import WorkflowVersion
    from workflows.triggers import immutability_suspended

    with append_only_suspended(connection):
        AuditEvent.objects.all().delete()
    ApprovalDecision.objects.all().delete()
    # Requests pin runs and each other (PROTECT): newest first.
    for approval in ApprovalRequest.objects.order_by("-pk"):
        approval.delete()
    Question.objects.all().delete()  # questions pin runs (PROTECT)
    Run.objects.all().delete()  # runs pin versions (PROTECT)
    with immutability_suspended(connection):
        WorkflowVersion.objects.all().delete()


@pytest.fixture
def portal_server() -> Iterator[PortalServer]:
    """A portal with fresh state on a free loopback port, served from a daemon thread."""
    server = make_server("127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory of its own with a short path: a sandbox's sockets are named by their path,
    which the test's own temporary directory (deep, and longer as pytest numbers its sessions)
    can make longer than a socket's path may be (107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="pw-", ignore_cleanup_errors=True) as short:
        yield Path(short)


@pytest.fixture
def run_files_in_tmp(settings: Settings, tmp_path: Path) -> Path:
    """The run files (pictures, observations, downloads) of this test in its own directory."""
    settings.RUN_FILES_DIR = tmp_path / "runs"
    return tmp_path / "runs"


@pytest.fixture
def reviewer(db: None) -> User:
    return user_with_role(Role.REVIEWERS, username="rory", email="rory@example.test")


# Two teams and an operator in each: the team tests' trio (with an admin, who holds both).
@pytest.fixture
def payables(db: None) -> Team:
    return team_make("payables")


@pytest.fixture
def procurement(db: None) -> Team:
    return team_make("procurement")


@pytest.fixture
def ours(payables: Team) -> User:
    return member_of(payables, Role.OPERATORS, username="paula")


@pytest.fixture
def theirs(procurement: Team) -> User:
    return member_of(procurement, Role.OPERATORS, username="pete")


@pytest.fixture
def portal(portal_server: PortalServer) -> str:
    """The base URL of a running portal, without trailing slash."""
    return f"http://127.0.0.1:{portal_server.server_port}"


@pytest.fixture(autouse=True)
def audit_checkpoints_in_tmp(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Checkpoints written by exports land in a directory of the test's own."""
    settings.AUDIT_CHECKPOINT_DIR = tmp_path_factory.mktemp("audit-checkpoints")


# Fixtures through which a test reaches the database, the channel layer or the run workers:
# what DATABASE_URL and REDIS_URL change.
SERVICE_FIXTURES = frozenset({"db", "transactional_db", "live_server", "django_db_setup"})


def _depends_on_services(item: pytest.Item) -> bool:
    if item.get_closest_marker("presentation"):
        return False
    if item.get_closest_marker("django_db") or item.get_closest_marker("e2e"):
        return True
    return bool(SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On the real-services pass, leave out what the embedded pass already proved.

    ``.ci/run`` runs the suite twice: embedded, then with DATABASE_URL and REDIS_URL. A test that
    reaches none of those services (the engine, the sandboxes, the demo portal, parsers) gives
    the same answer both times, so the second pass runs only tests that do reach them; so does
    a test of how pages render (``presentation``), whose data any database serves alike.
    """
    if not os.environ.get("DATABASE_URL") or config.getoption("--all-passes"):
        return
    left_out = [item for item in items if not _depends_on_services(item)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if _depends_on_services(item)]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--all-passes",
        action="store_true",
        help="with DATABASE_URL set, also run the tests that reach no database or channel layer",
    )
