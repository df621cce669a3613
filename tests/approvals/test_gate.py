"""The approval gate for real: the demo workflow in a local sandbox (system Chromium) behind its
egress proxy, against the bundled demo portal, stopping before its irreversible step."""

from __future__ import annotations

import json
import socket
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from django.conf import settings
from django.contrib.auth.models import User

from approvals import services as approvals
from approvals.models import ApprovalRequest
from pandaweb.demo_portal.server import PortalServer
from sessions import services
from sessions.models import Run
from sessions.services import execution
from tests.demo_portal.conftest import fetch_json
from tests.sessions.conftest import EXAMPLE, processes_with, publish
from workflows.models import Credential

pytestmark = [
    pytest.mark.usefixtures("run_files_in_tmp"),
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]


def post_form(url: str, data: dict[str, str]) -> Any:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    body = urllib.parse.urlencode(data).encode()
    with opener.open(url, data=body, timeout=10) as answer:
        return json.load(answer)


def browsers_of(run_key: str) -> list[psutil.Process]:
    return processes_with(f"/{run_key}/")


def gated_run(operator: User, portal_server: PortalServer, portal: str) -> Run:
    document = yaml.safe_load(
        EXAMPLE.read_text().replace("127.0.0.1:8001", portal.removeprefix("http://"))
    )
    workflow = publish(operator, document)
    invoice = next(i for i in portal_server.state.invoices() if i.status == "open")
    run = services.run_launch(
        workflow_id=workflow.pk,
        user=operator,
        raw_inputs={"invoice": invoice.number, "amount": f"{invoice.amount_due:.2f}"},
    )
    execution.run_execute(run_id=run.pk)
    run.refresh_from_db()
    return run


def test_the_gate_holds_the_payment_until_a_reviewer_approves_then_pays_once(
    operator: User,
    acme_credential: Credential,
    reviewer: User,
    portal_server: PortalServer,
    portal: str,
    continuations: list[dict[str, Any]],
    mailoutbox: list[Any],
) -> None:
    run = gated_run(operator, portal_server, portal)

    assert run.status == Run.Status.AWAITING_APPROVAL, run.failure_reason
    assert run.sandbox is not None
    key = run.sandbox["run_key"]
    approval = run.approvals.get()
    evidence = approval.evidence
    assert approval.action == (
        f"Click the button 'Submit payment' on {portal}/invoices/{run.inputs['invoice']}/pay"
    )
    assert evidence["target"]["tag"] == "button"
    assert evidence["target"]["text"] == "Submit payment"
    assert {f["step_id"]: f["value"] for f in evidence["filled"]} == {
        "fill-amount": run.inputs["amount"],
        "fill-iban": run.inputs["iban"],
    }
    assert evidence["outputs"]["total"] == run.inputs["amount"]
    assert "Submit payment" in evidence["page_text"]
    assert approval.evidence_sha256 == approvals.evidence_hash(evidence)
    files = Path(settings.RUN_FILES_DIR) / str(run.pk)
    assert (files / approval.outlined).read_bytes() != (files / approval.screenshot).read_bytes()
    assert browsers_of(key), "the browser must wait, alive, for the decision"
    assert fetch_json(f"{portal}/api/payments") == []
    [mail] = mailoutbox
    assert mail.to == ["rory@example.test"]
    assert approval.action in mail.body
    assert f"/approvals/{approval.pk}/" in mail.body

    approvals.approval_decide(
        approval_id=approval.pk,
        user=reviewer,
        approve=True,
        evidence_sha256=approval.evidence_sha256,
    )
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    # Any worker of the sandbox's host may continue it: the host's queue, not one worker's.
    assert continuations == [
        {
            "task": "runs.continue",
            "queue": services.host_queue(socket.gethostname()),
            "run_id": run.pk,
            "approval_id": approval.pk,
        }
    ]

    execution.run_continue(run_id=run.pk, approval_id=approval.pk)
    execution.run_continue(run_id=run.pk, approval_id=approval.pk)  # a duplicate changes nothing

    run.refresh_from_db()
    approval.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.failure_reason
    assert approval.intent_at is not None
    assert approval.completed_at is not None
    payments = fetch_json(f"{portal}/api/payments")
    assert len(payments) == 1
    assert payments[0]["invoice"] == run.inputs["invoice"]
    assert browsers_of(key) == []


def test_a_rejection_cancels_the_run_and_nothing_is_paid(
    operator: User,
    acme_credential: Credential,
    reviewer: User,
    portal_server: PortalServer,
    portal: str,
    continuations: list[dict[str, Any]],
) -> None:
    run = gated_run(operator, portal_server, portal)
    approval = run.approvals.get()
    assert run.sandbox is not None
    key = run.sandbox["run_key"]

    with pytest.raises(approvals.ApprovalRefused, match="needs a reason"):
        approvals.approval_decide(
            approval_id=approval.pk, user=reviewer, approve=False, evidence_sha256="x"
        )
    approvals.approval_decide(
        approval_id=approval.pk,
        user=reviewer,
        approve=False,
        reason="wrong IBAN",
        evidence_sha256=approval.evidence_sha256,
    )

    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    assert run.failure_reason == "rejected by rory: wrong IBAN"
    assert continuations == []
    assert browsers_of(key) == []
    assert fetch_json(f"{portal}/api/payments") == []


def test_a_page_that_changed_since_approval_is_not_acted_on_but_asked_again(
    operator: User,
    acme_credential: Credential,
    reviewer: User,
    portal_server: PortalServer,
    portal: str,
    continuations: list[dict[str, Any]],
) -> None:
    run = gated_run(operator, portal_server, portal)
    approval = run.approvals.get()
    assert run.sandbox is not None
    key = run.sandbox["run_key"]
    # The portal changes the reviewed payment's amount after the gate (a new fee, a new rate);
    # its review page, still open in the waiting browser, shows the new amount within a second.
    answer = post_form(
        f"{portal}/api/drafts/reprice", {"invoice": run.inputs["invoice"], "amount": "9999.00"}
    )
    assert answer == {"changed": 1}
    time.sleep(2.5)

    approvals.approval_decide(
        approval_id=approval.pk,
        user=reviewer,
        approve=True,
        evidence_sha256=approval.evidence_sha256,
    )
    execution.run_continue(run_id=run.pk, approval_id=approval.pk)

    run.refresh_from_db()
    approval.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    assert approval.status == ApprovalRequest.Status.VOIDED
    assert approval.intent_at is None
    again = approval.superseded_by
    assert again.status == ApprovalRequest.Status.PENDING
    assert any("9,999.00" in change for change in again.evidence["changes"]), again.evidence[
        "changes"
    ]
    assert fetch_json(f"{portal}/api/payments") == []

    services.run_cancel(run_id=run.pk, user=operator)
    again.refresh_from_db()
    assert again.status == ApprovalRequest.Status.VOIDED
    assert browsers_of(key) == []


def _database_url() -> str:
    from django.db import connection

    params = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{params['NAME']}"
    host, port = params.get("HOST") or "127.0.0.1", params.get("PORT") or 5432
    return f"postgresql://{params['USER']}@{host}:{port}/{params['NAME']}"


# The worker: executes the run to its gate, waits for the approval, continues. One process, as a
# Celery worker holding the browser's proxy would be.
WORKER = """
import time
from approvals.models import ApprovalRequest
from sessions.services import execution
execution.run_execute(run_id={run})
while not ApprovalRequest.objects.filter(run_id={run}, status="approved").exists():
    time.sleep(0.1)
approval = ApprovalRequest.objects.get(run_id={run}, status="approved")
execution.run_continue(run_id={run}, approval_id=approval.pk)
"""


def test_a_worker_killed_inside_the_payment_needs_reconciliation_and_never_pays_twice(
    operator: User,
    acme_credential: Credential,
    reviewer: User,
    portal_server: PortalServer,
    portal: str,
    continuations: list[dict[str, Any]],
    tmp_path: Path,
) -> None:
    import os
    import signal
    import subprocess
    import sys
    from datetime import timedelta

    document = yaml.safe_load(
        EXAMPLE.read_text().replace("127.0.0.1:8001", portal.removeprefix("http://"))
    )
    workflow = publish(operator, document)
    invoice = next(i for i in portal_server.state.invoices() if i.status == "open")
    run = services.run_launch(
        workflow_id=workflow.pk,
        user=operator,
        raw_inputs={"invoice": invoice.number, "amount": f"{invoice.amount_due:.2f}"},
    )
    # The portal records the payment at once but answers late: the worker dies in between.
    portal_server.slow_paths = {r"/pay/submit$": 30.0}
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "PANDAWEB_RUN_FILES_DIR": str(tmp_path / "worker-runs"),
        "DJANGO_SETTINGS_MODULE": "pandaweb.settings",
    }
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "shell", "-c", WORKER.format(run=run.pk)],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while not ApprovalRequest.objects.filter(run=run).exists():
            assert worker.poll() is None, "the worker exited before the gate"
            assert time.monotonic() < deadline, "the run never reached its gate"
            time.sleep(0.2)
        approval = ApprovalRequest.objects.get(run=run)
        run.refresh_from_db()
        assert run.sandbox is not None
        key = run.sandbox["run_key"]
        approvals.approval_decide(
            approval_id=approval.pk,
            user=reviewer,
            approve=True,
            evidence_sha256=approval.evidence_sha256,
        )
        while not portal_server.state.payments():
            approval.refresh_from_db()
            assert worker.poll() is None, "the worker exited before paying"
            assert time.monotonic() < deadline, "the payment was never sent"
            time.sleep(0.1)
        approval.refresh_from_db()
        assert approval.intent_at is not None
        assert approval.completed_at is None
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)

    assert services.run_reap(stale_after=timedelta(seconds=0)) == [run.pk]

    run.refresh_from_db()
    assert run.status == Run.Status.NEEDS_RECONCILIATION
    assert "may have happened" in run.failure_reason
    gone_by = time.monotonic() + 10
    while browsers_of(key):
        assert time.monotonic() < gone_by, "Chromium outlived its worker"
        time.sleep(0.1)
    # Nothing retries it: the payment stays single, and the run waits for a person.
    services.run_reap(stale_after=timedelta(seconds=0))
    assert len(fetch_json(f"{portal}/api/payments")) == 1
    run.refresh_from_db()
    assert run.status == Run.Status.NEEDS_RECONCILIATION
