"""Runs executed for real: the run service, the egress proxy, a local sandbox (system Chromium)
and the runner, against the bundled demo portal on loopback."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import psutil
import pytest
import yaml
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from PIL import Image

from pandaweb.audit.models import AuditEvent
from pandaweb.demo_portal import lab
from pandaweb.demo_portal.server import PortalServer
from pandaweb.demo_portal.state import DEMO_PASSWORD, DEMO_USERNAME
from sessions import services
from sessions.engine import observation as observing
from sessions.engine import recording
from sessions.engine.egress_policy import EgressPolicy
from sessions.engine.plan import RunPlan
from sessions.engine.proxy import EgressProxy
from sessions.engine.runner import Runner
from sessions.engine.sandbox import namespaces
from sessions.engine.sandbox.backends import get_backend
from sessions.engine.sandbox.base import SandboxSpec
from sessions.engine.sandbox.local import LocalBackend
from sessions.models import Run, RunEvent, StepResult
from sessions.services import execution
from sessions.services.egress import egress_dir
from tests.demo_portal.conftest import fetch_json
from tests.sessions.conftest import EXAMPLE, processes_with, publish
from workflows import services as workflow_services
from workflows.models import Credential

pytestmark = [
    pytest.mark.usefixtures("run_files_in_tmp"),
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]

CANARY = "canary-Zq8-never-shown"


def demo_document(portal_url: str) -> dict[str, Any]:
    host = portal_url.removeprefix("http://")
    return yaml.safe_load(EXAMPLE.read_text().replace("127.0.0.1:8001", host))


def execute(run: Run) -> Run:
    execution.run_execute(run_id=run.pk)
    run.refresh_from_db()
    return run


def chromium_of(run: Run) -> list[psutil.Process]:
    # Each xdist worker has its own database, so run ids repeat across workers; the installation
    # tag in the run key keeps this worker from counting another worker's browser.
    return processes_with(f"run-{run.pk}-{services.installation_tag()}")


def open_invoice(server: PortalServer) -> tuple[str, str]:
    invoice = next(i for i in server.state.invoices() if i.status == "open")
    return invoice.number, f"{invoice.amount_due:.2f}"


def test_the_demo_workflow_runs_to_its_irreversible_step_and_stops_there(
    operator: User, acme_credential: Credential, portal_server: PortalServer, portal: str
) -> None:
    workflow = publish(operator, demo_document(portal))
    number, amount = open_invoice(portal_server)
    run = services.run_launch(
        workflow_id=workflow.pk, user=operator, raw_inputs={"invoice": number, "amount": amount}
    )

    run = execute(run)

    steps = list(run.step_results.order_by("index"))
    assert run.status == Run.Status.AWAITING_APPROVAL, [(s.step_id, s.error) for s in steps]
    assert run.approvals.get().step_id == "submit-payment"
    assert [s.status for s in steps] == ["succeeded"] * 13
    # The run page says which browser ran and how it drew.
    assert run.sandbox_facts["browser"].startswith("Chromium ")
    assert run.sandbox_facts["frames"]
    assert run.outputs["total"] == amount
    assert fetch_json(f"{portal}/api/payments") == []
    csv = run.artifacts.get(name="invoice_csv")
    content = (Path(settings.RUN_FILES_DIR) / str(run.pk) / csv.path).read_bytes()
    assert number.encode() in content
    assert csv.sha256 == hashlib.sha256(content).hexdigest()
    assert all(s.screenshot_sha256 for s in steps)
    assert all(s.observation_chars > 0 for s in steps)
    by_id = {s.step_id: s for s in steps}
    # A read-only step on an unchanged page is pictured by the step before it; a step that typed
    # something is pictured anew.
    assert by_id["check-amount"].screenshot_sha256 == by_id["read-invoice"].screenshot_sha256
    assert by_id["fill-iban"].screenshot_sha256 != by_id["fill-amount"].screenshot_sha256
    picture = Path(settings.RUN_FILES_DIR) / str(run.pk) / by_id["check-amount"].screenshot
    assert Image.open(picture).format == "JPEG"
    # The browser waits for the decision; cancelling the run ends it.
    assert chromium_of(run)
    services.run_cancel(run_id=run.pk, user=operator)
    run.refresh_from_db()
    assert chromium_of(run) == []
    assert run.sandbox is None
    assert AuditEvent.objects.filter(action="credential.used", run_id=run.pk).count() == 1
    secret = "portal-demo-2026"
    for blob in (
        json.dumps(list(RunEvent.objects.values()), default=str),
        json.dumps(list(StepResult.objects.values("observation", "error", "sentence"))),
        json.dumps(list(AuditEvent.objects.values("before", "after", "extra")), default=str),
    ):
        assert secret not in blob


def test_the_demo_workflow_causes_no_refused_connections(
    operator: User, acme_credential: Credential, portal_server: PortalServer, portal: str
) -> None:
    # The demo workflow only talks to the portal: every refusal would be the browser's own
    # background traffic (updates, autofill, password-leak checks, ...) burying real ones.
    if not namespaces.probe().usable or settings.ENGINE_CONFIG.local_namespaces == "off":
        pytest.skip("a sandbox without namespaces has no private place for the managed policy")
    workflow = publish(operator, demo_document(portal))
    number, amount = open_invoice(portal_server)
    run = services.run_launch(
        workflow_id=workflow.pk, user=operator, raw_inputs={"invoice": number, "amount": amount}
    )

    run = execute(run)
    assert run.status == Run.Status.AWAITING_APPROVAL, run.failure_reason
    services.run_cancel(run_id=run.pk, user=operator)

    refused = AuditEvent.objects.filter(action="run.egress_denied", run_id=run.pk)
    assert [(a.after or {}).get("host") for a in refused] == []
    assert not run.events.filter(type="egress_denied").exists()


def test_egress_outside_the_allowlist_is_blocked_and_shown(
    operator: User, acme_credential: Credential, portal_server: PortalServer, portal: str
) -> None:
    port = portal_server.server_port
    received: list[bytes] = []
    sink = socket.socket()
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sink.bind(("127.0.0.9", port))
    sink.listen()
    sink.settimeout(0.2)

    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = sink.accept()
            except TimeoutError:
                continue
            received.append(conn.recv(1024))
            conn.close()

    listener = threading.Thread(target=accept, daemon=True)
    listener.start()
    workflow = publish(operator, {
        "name": "External", "slug": "external",
        "settings": {
            "allowed_hosts": [portal.removeprefix("http://")],
            "credentials": ["acme-portal"],
        },
        "steps": [
            {"id": "login-page", "type": "goto", "url": f"{portal}/login"},
            {"id": "log-in", "type": "login", "credential": "acme-portal",
             "username": {"label": "Username"}, "password": {"label": "Password"},
             "submit": {"role": "button", "name": "Sign in"}},
            {"id": "external", "type": "goto", "url": f"{portal}/lab/external"},
            {"id": "settle", "type": "wait_for", "network_idle": True},
        ],
    })  # fmt: skip
    run = services.run_launch(workflow_id=workflow.pk, user=operator, raw_inputs={})

    run = execute(run)
    stop.set()
    listener.join()
    sink.close()

    assert run.status == Run.Status.SUCCEEDED, run.failure_reason
    denied = {e.payload["host"] for e in run.events.filter(type="egress_denied")}
    assert {"tracker.evil.test", "cdn.acme.invalid", "127.0.0.9"} <= denied
    assert received == []
    assert AuditEvent.objects.filter(action="run.egress_denied", run_id=run.pk).count() >= 3


def test_a_page_sees_its_refused_requests_fail_and_the_run_records_each_refusal(
    operator: User, acme_credential: Credential, portal_server: PortalServer, portal: str
) -> None:
    port = portal_server.server_port
    # The lab page sends its copies to 127.0.0.9 on the portal's port: a browser that went
    # around the proxy, or a proxy that let it through, would land here.
    received: list[bytes] = []
    sink = socket.socket()
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sink.bind((lab.OTHER_LOOPBACK_HOST, port))
    sink.listen()
    sink.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = sink.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            received.append(conn.recv(1024))
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    workflow = publish(operator, {
        "name": "Sync", "slug": "sync",
        "settings": {
            "allowed_hosts": [portal.removeprefix("http://")],
            "credentials": ["acme-portal"],
        },
        "steps": [
            {"id": "login-page", "type": "goto", "url": f"{portal}/login"},
            {"id": "log-in", "type": "login", "credential": "acme-portal",
             "username": {"label": "Username"}, "password": {"label": "Password"},
             "submit": {"role": "button", "name": "Sign in"}},
            {"id": "sync", "type": "goto", "url": f"{portal}/lab/sync"},
            {"id": "finished", "type": "wait_for", "text": "Sync finished."},
            {"id": "read", "type": "extract", "fields": [
                {"name": "probes", "kind": "rows", "target": {"css": "#sync-probes tbody tr"},
                 "columns": {"probe": {"css": "td:nth-child(1)"},
                             "result": {"css": ".outcome"}}}]},
        ],
    })  # fmt: skip
    run = services.run_launch(workflow_id=workflow.pk, user=operator, raw_inputs={})

    run = execute(run)
    stop.set()
    sink.close()

    assert run.status == Run.Status.SUCCEEDED, run.failure_reason
    seen = {row["probe"]: row["result"] for row in run.outputs["probes"]}
    assert len(seen) == len(lab.SYNC_PROBES)
    # What the page itself observed: every probe that can see its result saw a network failure.
    observable = {label for probe, label in lab.SYNC_PROBES if probe not in ("beacon", "form")}
    control = dict(lab.SYNC_PROBES)["control"]
    for label in observable - {control}:
        assert seen[label].startswith("failed"), (label, seen[label])
    assert seen[control] == "answered (basic 200)"
    assert received == []
    # ...while the run knows exactly what was refused and why.
    events = [e.payload for e in run.events.filter(type="egress_denied")]
    refused = {(e["host"], e["method"]) for e in events}
    other = lab.OTHER_LOOPBACK_HOST
    assert {
        (other, "GET"),  # image, script
        (other, "POST"),  # fetch, no-cors fetch, XHR, beacon, form
        (other, "CONNECT"),  # no-cors fetch over HTTPS
        (lab.SYNC_COLLECTOR_HOST, "POST"),
    } <= refused
    reasons = {e["host"]: e["reason"] for e in events}
    assert reasons[other] == f"raw IP address {other} is not in the allowed hosts"
    assert reasons[lab.SYNC_COLLECTOR_HOST] == (
        f"{lab.SYNC_COLLECTOR_HOST} is not in this workflow's allowed hosts"
    )
    audited = AuditEvent.objects.filter(action="run.egress_denied", run_id=run.pk)
    named = {((a.after or {}).get("host"), (a.after or {}).get("reason")) for a in audited}
    assert named >= set(reasons.items())


def test_a_secret_is_typed_but_never_seen(
    operator: User, portal_server: PortalServer, portal: str
) -> None:
    workflow_services.credential_create(
        user=operator, name="canary", kind="username_password", description="",
        values={"username": "canary-user", "password": CANARY},
    )  # fmt: skip
    workflow = publish(operator, {
        "name": "Canary", "slug": "canary",
        "settings": {"allowed_hosts": [portal.removeprefix("http://")], "credentials": ["canary"]},
        "steps": [
            {"id": "login-page", "type": "goto", "url": f"{portal}/login"},
            {"id": "type-it", "type": "fill", "target": {"label": "Username"},
             "value": "{{ secrets.canary.password }}"},
            {"id": "picture", "type": "screenshot", "name": "login"},
        ],
    })  # fmt: skip
    run = services.run_launch(workflow_id=workflow.pk, user=operator, raw_inputs={})

    run = execute(run)

    assert run.status == Run.Status.SUCCEEDED, run.failure_reason
    step = run.step_results.get(step_id="type-it")
    assert step.sentence == "Fill the field labelled 'Username' with a secret"
    assert CANARY not in json.dumps(step.observation)
    assert step.observation is not None
    field = next(e for e in step.observation["elements"] if e["name"] == "Username")
    box = field["box"]
    inside = (box["x"] + 3, box["y"] + 3, box["x"] + box["width"] - 3, box["y"] + box["height"] - 3)
    # The step's evidence, and the picture the workflow asked for (a PNG of the same page).
    picture = run.artifacts.get(name="login")
    for stored in (step.screenshot, picture.path):
        image = Image.open(
            io.BytesIO((Path(settings.RUN_FILES_DIR) / str(run.pk) / stored).read_bytes())
        )
        extrema = image.convert("RGB").crop(inside).getextrema()
        assert isinstance(extrema[0], tuple)
        red, green, blue = cast(tuple[tuple[int, int], ...], extrema)
        # Every pixel of the field is Playwright's mask colour (#FF00FF), give or take JPEG's
        # error.
        assert (red[0] >= 230, green[1] <= 25, blue[0] >= 230) == (True, True, True), stored
    everything = json.dumps(
        [list(m.objects.values()) for m in (RunEvent, StepResult, AuditEvent, Run)], default=str
    )
    assert CANARY not in everything


def test_the_step_budget_fails_the_run_with_that_reason(
    operator: User, portal_server: PortalServer, portal: str
) -> None:
    workflow = publish(operator, {
        "name": "Budget", "slug": "budget",
        "settings": {"allowed_hosts": [portal.removeprefix("http://")], "step_budget": 2},
        "steps": [{"id": f"s{i}", "type": "goto", "url": f"{portal}/login"} for i in range(3)],
    })  # fmt: skip
    run = services.run_launch(workflow_id=workflow.pk, user=operator, raw_inputs={})

    run = execute(run)

    assert run.status == Run.Status.FAILED
    assert run.failure_reason == "the step budget of 2 steps was reached"
    assert run.steps_executed == 2


def test_a_broken_target_fails_in_plain_words(
    operator: User, portal_server: PortalServer, portal: str
) -> None:
    workflow = publish(operator, {
        "name": "Broken", "slug": "broken",
        "settings": {"allowed_hosts": [portal.removeprefix("http://")]},
        "steps": [
            {"id": "open", "type": "goto", "url": f"{portal}/login"},
            {"id": "pay", "type": "click", "irreversible": False, "timeout_ms": 1000,
             "target": {"role": "button", "name": "Submit payment"}},
        ],
    })  # fmt: skip
    run = services.run_launch(workflow_id=workflow.pk, user=operator, raw_inputs={})

    run = execute(run)

    failed = run.step_results.get(step_id="pay")
    assert run.status == Run.Status.FAILED
    assert failed.error == f"no button named 'Submit payment' on {portal}/login"
    assert failed.screenshot
    assert failed.observation


def test_cancel_kills_the_browser_within_two_seconds(
    operator: User, portal_server: PortalServer, portal: str
) -> None:
    workflow = publish(operator, {
        "name": "Slow", "slug": "slow",
        "settings": {"allowed_hosts": [portal.removeprefix("http://")]},
        "steps": [
            {"id": "open", "type": "goto", "url": f"{portal}/login"},
            {"id": "forever", "type": "wait_for", "text": "never there", "timeout_ms": 120000},
        ],
    })  # fmt: skip
    run = services.run_launch(workflow_id=workflow.pk, user=operator, raw_inputs={})
    worker = threading.Thread(target=execution.run_execute, kwargs={"run_id": run.pk})
    worker.start()
    deadline = time.monotonic() + 60
    while not StepResult.objects.filter(run=run).exists():
        assert time.monotonic() < deadline, "the run never executed its first step"
        time.sleep(0.2)

    started = time.monotonic()
    services.run_cancel(run_id=run.pk, user=operator)
    while chromium_of(run):
        assert time.monotonic() - started < 2, "the browser outlived the cancel"
        time.sleep(0.05)
    worker.join(timeout=30)

    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    assert not worker.is_alive()


@pytest.mark.parametrize("moment", ["before the browser starts", "once the browser answers"])
def test_a_run_cancelled_while_it_starts_leaves_nothing_running(
    operator: User, portal: str, monkeypatch: pytest.MonkeyPatch, moment: str
) -> None:
    """Whatever the cancel reaches first (the egress supervisor, the half-made sandbox), all
    that the start made is gone when the worker is done with the run."""

    workflow = publish(operator, {
        "name": "Start", "slug": "start",
        "settings": {"allowed_hosts": [portal.removeprefix("http://")]},
        "steps": [{"id": "open", "type": "goto", "url": f"{portal}/login"}],
    })  # fmt: skip
    run = services.run_launch(workflow_id=workflow.pk, user=operator, raw_inputs={})
    create = LocalBackend.create
    run_keys: list[str] = []

    def create_and_cancel(backend: LocalBackend, spec: Any) -> Any:
        run_keys.append(spec.run_key)
        if moment == "before the browser starts":
            services.run_cancel(run_id=run.pk, user=operator)
        sandbox = create(backend, spec)
        if moment == "once the browser answers":
            services.run_cancel(run_id=run.pk, user=operator)
        return sandbox

    monkeypatch.setattr(LocalBackend, "create", create_and_cancel)

    run = execute(run)

    assert run.status == Run.Status.CANCELLED
    (run_key,) = run_keys
    assert processes_with(run_key) == []
    assert not egress_dir(run_key).exists()
    assert not (LocalBackend(settings.ENGINE_CONFIG).root / run_key).exists()


class RecordingSink:
    def __init__(self) -> None:
        self.records: list[Any] = []
        self.actions: list[tuple[str, int]] = []

    def step_finished(self, record: Any) -> None:
        self.records.append(record)

    def action_starting(self, index: int) -> None:
        self.actions.append(("intent", index))

    def action_finished(self, index: int, result: str = "") -> None:
        self.actions.append(("completion", index))

    def action_refused(self, index: int, reason: str) -> None:
        self.actions.append(("refusal", index))

    def stop_reason(self) -> str | None:
        return None


def test_the_run_time_limit_expires_the_run_mid_step(portal: str, tmp_path: Path) -> None:

    backend = get_backend("local", settings.ENGINE_CONFIG)
    with EgressProxy(
        EgressPolicy([portal.removeprefix("http://")]), on_denied=lambda a: None
    ) as proxy:
        sandbox = backend.create(
            SandboxSpec(run_key=f"ttl-{tmp_path.name[-8:]}", proxy_url=proxy.url, ttl_seconds=60)
        )
        try:
            plan = RunPlan(
                steps=[
                    {"id": "open", "type": "goto", "url": f"{portal}/login"},
                    {"id": "wait", "type": "wait_for", "text": "never there", "timeout_ms": 60000},
                    {"id": "after", "type": "goto", "url": f"{portal}/login"},
                ],
                inputs={},
                secrets={},
                step_budget=10,
                deadline=time.time() + 6,
                artifacts_dir=tmp_path,
            )
            sink = RecordingSink()
            started = time.monotonic()

            outcome = Runner(plan, sink).run(sandbox.cdp_url)

            assert outcome.status == "expired"
            assert outcome.reason == "the run's time limit was reached"
            assert outcome.failed_step == "wait"
            assert [r.step_id for r in sink.records] == ["open", "wait"]
            assert time.monotonic() - started < 30
        finally:
            backend.destroy(sandbox)


def _database_url() -> str:

    params = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{params['NAME']}"
    host, port = params.get("HOST") or "127.0.0.1", params.get("PORT") or 5432
    return f"postgresql://{params['USER']}@{host}:{port}/{params['NAME']}"


def test_a_worker_killed_mid_run_leaves_an_interrupted_run_and_no_browser(
    operator: User, portal_server: PortalServer, portal: str, tmp_path: Path
) -> None:
    workflow = publish(operator, {
        "name": "Long", "slug": "long",
        "settings": {"allowed_hosts": [portal.removeprefix("http://")]},
        "steps": [
            {"id": "open", "type": "goto", "url": f"{portal}/login"},
            {"id": "forever", "type": "wait_for", "text": "never there", "timeout_ms": 120000},
        ],
    })  # fmt: skip
    run = services.run_launch(workflow_id=workflow.pk, user=operator, raw_inputs={})
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "PANDAWEB_RUN_FILES_DIR": str(tmp_path / "runs"),
        "DJANGO_SETTINGS_MODULE": "pandaweb.settings",
    }
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "shell", "-c",
         f"from sessions.services import execution; execution.run_execute(run_id={run.pk})"],
        cwd=Path(__file__).resolve().parents[2], env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 90
    while not StepResult.objects.filter(run=run).exists():
        assert worker.poll() is None, "the worker exited before its first step"
        assert time.monotonic() < deadline, "the worker never executed its first step"
        time.sleep(0.2)
    assert chromium_of(run)

    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)
    reaped = services.run_reap(stale_after=timedelta(seconds=0))

    run.refresh_from_db()
    assert reaped == [run.pk]
    assert run.status == Run.Status.INTERRUPTED
    assert run.sandbox is None
    gone_by = time.monotonic() + 5
    while chromium_of(run):
        assert time.monotonic() < gone_by, "Chromium outlived its interrupted run"
        time.sleep(0.1)


def test_a_read_only_step_on_an_unchanged_page_takes_no_new_evidence(
    portal: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    taken: list[str] = []
    take = observing.take

    def counting_take(page: Any, **kwargs: Any) -> observing.Snapshot:
        taken.append(page.url)
        return take(page, **kwargs)

    monkeypatch.setattr(observing, "take", counting_take)
    backend = get_backend("local", settings.ENGINE_CONFIG)
    with EgressProxy(
        EgressPolicy([portal.removeprefix("http://")]), on_denied=lambda a: None
    ) as proxy:
        sandbox = backend.create(
            SandboxSpec(run_key=f"same-{tmp_path.name[-8:]}", proxy_url=proxy.url, ttl_seconds=60)
        )
        try:
            plan = RunPlan(
                steps=[
                    {"id": "login-page", "type": "goto", "url": f"{portal}/login"},
                    {
                        "id": "user",
                        "type": "fill",
                        "target": {"label": "Username"},
                        "value": DEMO_USERNAME,
                    },
                    {
                        "id": "password",
                        "type": "fill",
                        "target": {"label": "Password"},
                        "value": DEMO_PASSWORD,
                    },
                    {
                        "id": "sign-in",
                        "type": "click",
                        "target": {"role": "button", "name": "Sign in"},
                    },
                    {"id": "open", "type": "goto", "url": f"{portal}/lab/transactions"},
                    {
                        "id": "check",
                        "type": "assert",
                        "checks": [{"kind": "text_present", "text": "TX-01000"}],
                    },
                    {"id": "wait", "type": "wait_for", "text": "TX-00999"},
                    {
                        "id": "tick",
                        "type": "click",
                        "target": {"role": "checkbox", "name": "Select TX-00001"},
                    },
                    {
                        "id": "check-again",
                        "type": "assert",
                        "checks": [{"kind": "text_present", "text": "TX-00001"}],
                    },
                ],
                inputs={},
                secrets={},
                step_budget=10,
                deadline=time.time() + 120,
                artifacts_dir=tmp_path,
            )
            sink = RecordingSink()

            outcome = Runner(plan, sink).run(sandbox.cdp_url)
        finally:
            backend.destroy(sandbox)

    assert outcome.status == "succeeded", outcome.reason
    opened, check, wait, tick, again = sink.records[-5:]
    # One snapshot for the page, none for the two read-only steps that found it as it was, one
    # after the click (which changed it), none for the check that followed.
    assert len([url for url in taken if url.endswith("/lab/transactions")]) == 2
    assert check.pending is opened.pending
    assert wait.pending is opened.pending
    assert check.screenshot is opened.screenshot
    assert tick.pending is not opened.pending
    assert again.pending is tick.pending
    for record in sink.records:
        recording.finish(record)
    ticked = next(e for e in tick.observation["elements"] if e["name"] == "Select TX-00001")
    assert "checked" in ticked["state"]
    assert tick.observation_chars > 0
    assert again.observation == tick.observation
