"""The HTTP API on the real stack: an external script launches through the API with a service
token, a reviewer decides through the API with their own token, a webhook receiver on loopback
gets the signed events, the script reads the outputs and downloads the evidence bundle."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks import Webhook

from pandaweb.demo_portal.state import PortalState
from tests.e2e.conftest import Stack

pytestmark = [pytest.mark.e2e]

SCRIPT = Path(__file__).with_name("api_script.py")


@pytest.fixture
def inbox() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A webhook receiver on loopback keeping the raw body and headers of every POST."""
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append({"body": body, "headers": dict(self.headers.items())})
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hooks", received
    server.shutdown()
    server.server_close()


def delivered(
    received: list[dict[str, Any]], secret: str, event_type: str, deadline: float
) -> dict[str, Any]:
    """The first ``event_type`` the receiver got, its signature verified; waits until deadline."""
    while time.monotonic() < deadline:
        for message in list(received):
            if json.loads(message["body"])["type"] == event_type:
                event: dict[str, Any] = Webhook(secret).verify(message["body"], message["headers"])
                return event
        time.sleep(0.5)
    raise AssertionError(f"no {event_type} delivered; got {[m['body'] for m in received]}")


def api(stack: Stack, token: str, method: str, path: str, body: Any = None) -> Any:
    request = urllib.request.Request(  # noqa: S310
        f"{stack.url}/api/v1{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    # Our own http:// base URL, never a user-supplied scheme.
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
        return json.loads(response.read())


def test_an_external_system_pays_an_invoice_through_the_api_with_a_human_gate(
    stack: Stack, tmp_path: Path, inbox: tuple[str, list[dict[str, Any]]]
) -> None:
    url, received = inbox
    stack.manage("demo_workflow")
    secret = stack.manage(
        "shell", "-c",
        "from django.contrib.auth.models import User; "
        "from pandaweb.webhooks.services import subscription_create; "
        "s, secret = subscription_create(user=User.objects.get(username='ada.admin'), "
        f"name='erp', url='{url}', events=['run.finished', 'run.failed', "
        "'approval.requested'], workflow_id=None); print(secret)",
    ).strip().splitlines()[-1]  # fmt: skip
    erp_token = stack.manage(
        "api_token", "erp", "--name", "erp-prod", "--service", "--by", "ada.admin",
        "--role", "Operators", "--role", "Compliance",
        "--scope", "runs:launch", "--scope", "runs:read", "--scope", "audit:read",
    ).strip()  # fmt: skip
    reviewer_token = stack.manage(
        "api_token", "rory.reviewer", "--name", "phone",
        "--scope", "approvals:read", "--scope", "approvals:decide",
    ).strip()  # fmt: skip
    invoice = next(i for i in PortalState().invoices() if i.status == "open")
    bundle_path = tmp_path / "bundle.zip"
    script = subprocess.Popen(
        [sys.executable, str(SCRIPT)],
        env={
            "PANDAWEB_URL": stack.url,
            "PANDAWEB_TOKEN": erp_token,
            "BUNDLE_PATH": str(bundle_path),
            "RUN_INPUTS": json.dumps(
                {"invoice": invoice.number, "amount": f"{invoice.amount_due:.2f}"}
            ),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # The reviewer's system polls for requests its owner may decide.
        deadline = time.monotonic() + 300
        pending: list[dict[str, Any]] = []
        while not pending:
            assert time.monotonic() < deadline, stack.log_tail()
            assert script.poll() is None, script.stdout.read() if script.stdout else ""
            pending = api(stack, reviewer_token, "GET", "/approvals/")
            time.sleep(1)
        request = api(stack, reviewer_token, "GET", f"/approvals/{pending[0]['id']}")
        assert request["workflow"] == "acme-pay-invoice"
        assert request["launched_by"] == "erp"
        assert request["evidence"]["inputs"]["amount"] == f"{invoice.amount_due:.2f}"
        requested = delivered(received, secret, "approval.requested", time.monotonic() + 60)
        assert requested["data"]["evidence_sha256"] == request["evidence_sha256"]
        decided = api(
            stack, reviewer_token, "POST", f"/approvals/{request['id']}/decision",
            {"verdict": "approve", "evidence_sha256": request["evidence_sha256"]},
        )  # fmt: skip
        assert decided["status"] == "approved"
        out, _ = script.communicate(timeout=300)
    finally:
        if script.poll() is None:
            script.kill()
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert lines[0]["http"] == 201
    assert lines[1] == {"retried": lines[0]["launched"], "http": 200}
    statuses = [line["status"] for line in lines if "status" in line]
    assert "awaiting_approval" in statuses, out
    final = lines[-1]
    assert final["final"] == "succeeded", (out, stack.log_tail())
    assert str(final["outputs"].get("receipt", "")).startswith("RCPT-"), final
    assert f"{invoice.number}.csv" in final["artifacts"]
    finished = delivered(received, secret, "run.finished", time.monotonic() + 60)
    assert finished["data"]["id"] == lines[0]["launched"]
    assert finished["data"]["outputs"]["receipt"] == final["outputs"]["receipt"]
    assert all(b"portal-demo" not in m["body"] for m in received)  # no credential
    with zipfile.ZipFile(io.BytesIO(bundle_path.read_bytes())) as bundle:
        names = bundle.namelist()
        assert "SHA256SUMS" in names
        assert "timeline.json" in names
        timeline = json.loads(bundle.read("timeline.json"))
    assert timeline["run"]["id"] == lines[0]["launched"]
