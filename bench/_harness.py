"""Shared set-up for the run benchmarks (not a benchmark itself).

The demo portal on a free loopback port (optionally slowed down), the demo workflow pointed at
it, the production persistence path (Django on a throw-away SQLite database), a local sandbox
behind the run's egress proxy, the bare-Playwright baseline of the workflow's first 13 steps, and
the scale-out stack's pieces (a scratch PostgreSQL database, Celery worker processes).
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pandaweb.demo_portal.server import PortalServer, make_server  # noqa: E402
from pandaweb.demo_portal.state import DEMO_PASSWORD, DEMO_USERNAME, PortalState  # noqa: E402
from sessions.engine.config import EngineConfig  # noqa: E402
from sessions.engine.egress_policy import EgressPolicy  # noqa: E402
from sessions.engine.proxy import EgressProxy  # noqa: E402
from sessions.engine.sandbox.base import Sandbox, SandboxSpec  # noqa: E402
from sessions.engine.sandbox.local import LocalBackend  # noqa: E402

EXAMPLE = ROOT / "workflows" / "examples" / "acme-pay-invoice.yaml"
EXAMPLE_HOST = "127.0.0.1:8001"
# Everything before the irreversible step 14 (submit-payment).
BEFORE_PAYING = 13
CREDENTIAL = "acme-portal"


# The engine's settings ---------------------------------------------------------------------------


def engine_config(**fields: Any) -> EngineConfig:
    """The engine's defaults for a benchmark run without Django, with ``fields`` and with the
    Chromium, how it draws and the guest images the operator named where pandaweb's settings
    look for them (``PANDAWEB_CHROMIUM``, ``PANDAWEB_BEGIN_FRAME``,
    ``PANDAWEB_MICROVM_IMAGE_DIR``)."""
    default = EngineConfig()
    images = os.environ.get("PANDAWEB_MICROVM_IMAGE_DIR", "").strip()
    named: dict[str, Any] = {
        "chromium": os.environ.get("PANDAWEB_CHROMIUM", "").strip(),
        # EngineConfig refuses a mode it does not know.
        "begin_frame": os.environ.get("PANDAWEB_BEGIN_FRAME", "").strip() or default.begin_frame,
        "microvm_image_dir": Path(images).expanduser() if images else default.microvm_image_dir,
    }
    return replace(default, **{**named, **fields})


# Statistics --------------------------------------------------------------------------------------


def stats(values: list[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


def load_line() -> str:
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} CPUs, load average (1/5/15 min) {load}"


# The portal --------------------------------------------------------------------------------------


def set_delay(server: PortalServer, seconds: float) -> None:
    server.latency = seconds


@contextmanager
def portal() -> Iterator[PortalServer]:
    """The demo portal on a free loopback port; ``set_delay`` slows every answer down."""
    server = make_server("127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, name="portal", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def portal_host(server: PortalServer) -> str:
    return f"127.0.0.1:{server.server_port}"


@dataclass(frozen=True)
class Workflow:
    document: dict[str, Any]
    text: str
    steps: list[dict[str, Any]]
    inputs: dict[str, Any]
    secrets: dict[str, dict[str, str]]
    host: str


def demo_workflow(host: str, *, steps: int | None = BEFORE_PAYING) -> Workflow:
    """The example workflow pointed at ``host``, with its first ``steps`` steps (None: all)."""
    text = EXAMPLE.read_text().replace(EXAMPLE_HOST, host)
    document = yaml.safe_load(text)
    if steps is not None:
        document["steps"] = document["steps"][:steps]
        text = yaml.safe_dump(document, sort_keys=False)
    invoice = next(i for i in PortalState().invoices() if i.status == "open")
    inputs = {
        "invoice": invoice.number,
        "amount": f"{invoice.amount_due:.2f}",
        "iban": "DE97 2004 0060 0123 4567 89",
    }
    return Workflow(
        document=document,
        text=text,
        steps=list(document["steps"]),
        inputs=inputs,
        secrets={CREDENTIAL: {"username": DEMO_USERNAME, "password": DEMO_PASSWORD}},
        host=host,
    )


def dense_steps(host: str) -> list[dict[str, Any]]:
    """Steps on the demo portal's three dense lab pages, read-only steps included: appended to
    the demo flow for the *dense* scenario (``bare_dense`` does the same in plain Playwright)."""
    base = f"http://{host}"
    return [
        {"id": "open-transactions", "type": "goto", "url": f"{base}/lab/transactions"},
        {"id": "check-last-row", "type": "assert",
         "checks": [{"kind": "text_present", "text": "TX-01000"}]},
        {"id": "read-heading", "type": "extract",
         "fields": [{"name": "heading", "kind": "text",
                     "target": {"role": "heading", "name": "Transactions"}}]},
        {"id": "select-row", "type": "click",
         "target": {"role": "checkbox", "name": "Select TX-00500"}},
        {"id": "open-products", "type": "goto", "url": f"{base}/lab/products"},
        {"id": "wait-products", "type": "wait_for", "text": "Product 300"},
        {"id": "picture-products", "type": "screenshot", "name": "products"},
        {"id": "open-menu", "type": "goto", "url": f"{base}/lab/mega-menu"},
        {"id": "check-menu", "type": "assert",
         "checks": [{"kind": "text_present", "text": "Topic 20.20"}]},
    ]  # fmt: skip


def bare_dense(page: Any, host: str, downloads: Path) -> None:
    """``dense_steps`` as a plain Playwright script."""
    base = f"http://{host}"
    page.goto(f"{base}/lab/transactions", wait_until="load")
    if page.get_by_text("TX-01000").count() == 0:
        raise AssertionError("the last transaction is missing")
    page.get_by_role("heading", name="Transactions").inner_text()
    page.get_by_role("checkbox", name="Select TX-00500").click()
    page.goto(f"{base}/lab/products", wait_until="load")
    page.get_by_text("Product 300").first.wait_for(state="visible")
    (downloads / "products.png").write_bytes(page.screenshot(type="png"))
    page.goto(f"{base}/lab/mega-menu", wait_until="load")
    if page.get_by_text("Topic 20.20").count() == 0:
        raise AssertionError("the last menu topic is missing")


# Django, the way a worker runs it ----------------------------------------------------------------


@dataclass
class Persistence:
    """A configured Django on a throw-away data directory, with the workflow published."""

    data_dir: Path
    workflow_id: int
    version_id: int
    user_id: int

    def new_run(self, inputs: dict[str, Any]) -> int:
        from django.utils import timezone

        from sessions.models import Run

        now = timezone.now()
        run = Run.objects.create(
            workflow_id=self.workflow_id,
            version_id=self.version_id,
            inputs=inputs,
            launched_by_id=self.user_id,
            status=Run.Status.RUNNING,
            started_at=now,
            heartbeat_at=now,
        )
        return run.pk

    def counts(self, run_id: int) -> dict[str, int]:
        from pandaweb.audit.models import AuditEvent
        from sessions.models import Artifact, RunEvent, StepResult

        return {
            "steps": StepResult.objects.filter(run_id=run_id).count(),
            "artifacts": Artifact.objects.filter(run_id=run_id).count(),
            "events": RunEvent.objects.filter(run_id=run_id).count(),
            "audit": AuditEvent.objects.filter(run_id=run_id).count(),
        }


def setup_django(workflow: Workflow, data_dir: Path) -> Persistence:
    """Configure Django on SQLite in ``data_dir``, migrate, and publish ``workflow``."""
    for name in ("DATABASE_URL", "REDIS_URL", "PANDAWEB_RUN_FILES_DIR"):
        os.environ.pop(name, None)
    os.environ["DJANGO_SETTINGS_MODULE"] = "pandaweb.settings"
    os.environ["PANDAWEB_DATA_DIR"] = str(data_dir)
    import django

    from pandaweb.localfiles import ensure_local_files

    ensure_local_files()
    django.setup()
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command

    from pandaweb.core.roles import Role
    from pandaweb.core.services import roles_sync
    from workflows import services

    # Django's logging config shows the portal's access log; a benchmark has no use for it.
    logging.getLogger("pandaweb.demo_portal.server").setLevel(logging.WARNING)
    call_command("migrate", verbosity=0)
    roles_sync()
    user = User.objects.create_user("bench", password=uuid.uuid4().hex)
    for role in (Role.OPERATORS,):
        group = Group.objects.filter(name=role.value).first()
        if group is not None:
            user.groups.add(group)
    fields = workflow.secrets[CREDENTIAL]
    services.credential_create(
        user=user,
        name=CREDENTIAL,
        kind="username_password",
        description="bench",
        values=dict(fields),
    )
    imported = services.workflow_import(user=user, text=workflow.text)
    version = services.workflow_publish(
        workflow_id=imported.pk, user=user, message="bench", accept_warnings=True
    )
    return Persistence(data_dir, imported.pk, version.pk, user.pk)


# The scale-out stack -----------------------------------------------------------------------------


def scratch_database(server_url: str, name: str = "") -> tuple[str, tuple[Any, str]]:
    """Create the empty database ``name`` (default ``pandaweb_bench_<pid>``) on the server of
    ``server_url``; return its URL and what ``drop_database`` needs."""
    import psycopg

    name = name or f"pandaweb_bench_{os.getpid()}"
    admin = psycopg.connect(server_url, autocommit=True)
    admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    admin.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(server_url)
    return urlunsplit(parts._replace(path=f"/{name}")), (admin, name)


def drop_database(handle: tuple[Any, str]) -> None:
    admin, name = handle
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


def start_worker(
    env: dict[str, str],
    log: Path,
    *,
    queues: str = "",
    name: str = "bench",
    pool: str = "threads",
    concurrency: int = 2,
) -> subprocess.Popen[bytes]:
    """A Celery worker process (threads pool, as ``manage.py up`` starts it), once it is ready.
    By default it takes the shared queue and this host's own (continuations)."""
    from sessions.services import host_queue

    queues = queues or f"pandaweb,{host_queue(socket.gethostname())}"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "pandaweb", "worker", "--loglevel", "INFO",
                "--pool", pool, "--concurrency", str(concurrency), "--hostname", f"{name}@%h",
                "--queues", queues,
            ],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while b"ready." not in log.read_bytes():
        if worker.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the Celery worker did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.2)
    return worker


def free_port() -> int:
    """A loopback port the OS says is free now (for a server started as another process)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.005)


# The sandbox -------------------------------------------------------------------------------------


@contextmanager
def egress_proxy(host: str) -> Iterator[EgressProxy]:
    proxy = EgressProxy(EgressPolicy([host]), on_denied=lambda attempt: None)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


@contextmanager
def sandbox(backend: LocalBackend, proxy: EgressProxy) -> Iterator[Sandbox]:
    spec = SandboxSpec(
        run_key=f"bench-{uuid.uuid4().hex[:8]}", proxy_url=proxy.url, ttl_seconds=600
    )
    box = backend.create(spec)
    try:
        yield box
    finally:
        backend.destroy(box)


def temp_dir(prefix: str) -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix=prefix)


# The baseline ------------------------------------------------------------------------------------


@dataclass
class BareTiming:
    total: float  # Playwright start + CDP connect + steps (+ tracing) + disconnect
    steps: float  # first step started → last step done
    trace_write: float = 0.0  # tracing.stop(path=…), with a trace asked for
    trace_bytes: int = 0


def bare_run(
    cdp_url: str,
    workflow: Workflow,
    downloads: Path,
    *,
    dense: bool = False,
    artifacts_dir: str | None = None,
    trace: Path | None = None,
) -> BareTiming:
    """The workflow's first 13 steps as a plain Playwright script: same clicks, fills, gotos,
    extract, download and screenshot, plain locators, no observation and no recording.

    On a warm Playwright driver, as the runner has (``sessions.engine.driver.with_browser``:
    connect, work, disconnect on a driver thread kept alive between runs): what differs is
    recording only.

    With ``trace``, Playwright's own tracing (screenshots and DOM snapshots) is on from before
    the first step, and the trace is written there after the last: the evidence a Playwright
    user can have. Starting and writing it count in ``total``, not in ``steps``.
    """
    from sessions.engine.driver import with_browser

    base = f"http://{workflow.host}"
    invoice = workflow.inputs["invoice"]
    login = workflow.secrets[CREDENTIAL]
    marks: list[float] = []
    writing: list[float] = []

    def work(browser: Any) -> None:
        context = browser.contexts[0] if browser.contexts else browser.new_context()
        page = context.pages[0] if context.pages else context.new_page()
        if trace is not None:
            context.tracing.start(screenshots=True, snapshots=True)
        marks.append(time.perf_counter())
        page.goto(f"{base}/login", wait_until="load")  # 1 open-login
        page.get_by_label("Username").fill(login["username"])  # 2 log-in
        page.get_by_label("Password").fill(login["password"])
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_load_state("load")
        page.get_by_text("Open invoices").first.wait_for(state="visible")  # 3 wait-dashboard
        page.get_by_role("button", name="Accept").click()  # 4 accept-cookies
        page.wait_for_load_state("load")
        page.goto(f"{base}/invoices/{invoice}", wait_until="load")  # 5 open-invoice
        text = page.get_by_test_id("amount-due").inner_text()  # 6 read-invoice
        total = Decimal("".join(c for c in text if c.isdigit() or c in ".-"))
        if total != Decimal(workflow.inputs["amount"]):  # 7 check-amount
            raise AssertionError(f"amount due {total} != {workflow.inputs['amount']}")
        with page.expect_download() as download_info:  # 8 download-csv
            page.get_by_role("link", name="Download CSV").click()
        download = download_info.value
        download.save_as(downloads / (download.suggested_filename or "invoice.csv"))
        page.goto(f"{base}/invoices/{invoice}/pay", wait_until="load")  # 9 open-pay-form
        page.get_by_label("Amount").fill(workflow.inputs["amount"])  # 10 fill-amount
        page.get_by_label("IBAN").fill(workflow.inputs["iban"])  # 11 fill-iban
        page.get_by_role("button", name="Review payment").click()  # 12 review
        page.wait_for_load_state("load")
        png = page.screenshot(type="png")  # 13 before-paying
        (downloads / "payment_review.png").write_bytes(png)
        marks.append(time.perf_counter())
        if "Submit payment" not in page.content():
            raise AssertionError(f"the review page did not come up ({page.url})")
        if dense:
            # The check above is not a step of the workflow: it stays out of the steps time.
            t3 = time.perf_counter()
            bare_dense(page, workflow.host, downloads)
            marks[-1] += time.perf_counter() - t3
        if trace is not None:
            t4 = time.perf_counter()
            context.tracing.stop(path=trace)
            writing.append(time.perf_counter() - t4)

    t0 = time.perf_counter()
    # Where a browser in namespaces writes downloads for Playwright to read (the runner is given
    # the same: sandbox.details["artifacts_dir"]).
    with_browser(cdp_url, work, artifacts_dir=artifacts_dir)
    total = time.perf_counter() - t0
    t1, t2 = marks
    if trace is None:
        return BareTiming(total=total, steps=t2 - t1)
    return BareTiming(
        total=total, steps=t2 - t1, trace_write=writing[0], trace_bytes=trace.stat().st_size
    )
