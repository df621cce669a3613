"""Shared set-up for the run benchmarks (not a benchmark itself).

The demo portal on a free loopback port (optionally slowed down), the demo workflow pointed at
it, the production persistence path (Django on a throw-away SQLite database), a local sandbox
behind the run's egress proxy, and the bare-Playwright baseline of the workflow's first 13 steps.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pandaweb.demo_portal.server import PortalServer, make_server  # noqa: E402
from pandaweb.demo_portal.state import DEMO_PASSWORD, DEMO_USERNAME, PortalState  # noqa: E402
from sessions.proxy import EgressPolicy, EgressProxy  # noqa: E402
from sessions.sandbox import Sandbox, SandboxSpec  # noqa: E402
from sessions.sandbox.local import LocalBackend  # noqa: E402

EXAMPLE = ROOT / "workflows" / "examples" / "acme-pay-invoice.yaml"
EXAMPLE_HOST = "127.0.0.1:8001"
# Everything before the irreversible step 14 (submit-payment).
BEFORE_PAYING = 13
CREDENTIAL = "acme-portal"


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
    total: float  # Playwright start + CDP connect + steps + disconnect
    steps: float  # first step started → last step done


def bare_run(cdp_url: str, workflow: Workflow, downloads: Path) -> BareTiming:
    """The workflow's first 13 steps as a plain Playwright script: same clicks, fills, gotos,
    extract, download and screenshot, plain locators, no observation and no recording."""
    from playwright.sync_api import sync_playwright

    base = f"http://{workflow.host}"
    invoice = workflow.inputs["invoice"]
    login = workflow.secrets[CREDENTIAL]
    t0 = time.perf_counter()
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(cdp_url, timeout=15_000)
        try:
            context = browser.contexts[0] if browser.contexts else browser.new_context()
            page = context.pages[0] if context.pages else context.new_page()
            t1 = time.perf_counter()
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
            t2 = time.perf_counter()
            if "Submit payment" not in page.content():
                raise AssertionError(f"the review page did not come up ({page.url})")
        finally:
            browser.close()
    return BareTiming(total=time.perf_counter() - t0, steps=t2 - t1)
