"""The client library (clients/python) and its ``pandaweb`` command against the live stack, as
an integrator's machine runs them: launch with idempotency and wait, read the request's facts,
decide with a reviewer's token (bound to the evidence), download the evidence bundle; refusals
come back in the server's words with their field paths."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from pandaweb_client import ApiError, Client

from pandaweb.demo_portal.state import PortalState
from tests.e2e.conftest import Stack

pytestmark = [pytest.mark.e2e]


def command(stack: Stack, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed ``pandaweb`` program, as a shell on another machine runs it."""
    program = Path(sys.executable).with_name("pandaweb")
    return subprocess.run(
        [str(program), "--url", stack.url, *args],
        env={**os.environ, "PANDAWEB_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_a_day_driven_from_the_client_library_and_its_command(stack: Stack, tmp_path: Path) -> None:
    stack.manage("demo_workflow")
    operator_token = stack.manage(
        "api_token", "erp-client", "--name", "erp-prod", "--service", "--by", "ada.admin",
        "--role", "Operators", "--role", "Compliance",
        "--scope", "runs:launch", "--scope", "runs:read", "--scope", "audit:read",
    ).strip()  # fmt: skip
    reviewer_token = stack.manage(
        "api_token", "rory.reviewer", "--name", "client-library",
        "--scope", "approvals:read", "--scope", "approvals:decide",
    ).strip()  # fmt: skip
    invoice = [i for i in PortalState().invoices() if i.status == "open"][-1]
    amount = f"{invoice.amount_due:.2f}"

    refused = command(
        stack, operator_token, "launch", "acme-pay-invoice",
        f"invoice={invoice.number}", "amount=12,34,5",
    )  # fmt: skip
    assert refused.returncode == 1, refused
    assert "inputs.amount:" in refused.stderr

    key = f"erp-{invoice.number}"
    launched = command(
        stack, operator_token, "launch", "acme-pay-invoice", f"invoice={invoice.number}",
        f"amount={amount}", "--idempotency-key", key, "--wait", "--timeout", "300",
    )  # fmt: skip
    assert launched.returncode == 0, (launched, stack.log_tail())
    assert "awaiting_approval" in launched.stdout
    assert "waits for approval #" in launched.stdout

    with Client(stack.url, operator_token) as operator, Client(stack.url, reviewer_token) as rory:
        # The same key and body: the same run, not a second payment.
        again = operator.launch(
            "acme-pay-invoice", {"invoice": invoice.number, "amount": amount}, idempotency_key=key
        )
        assert f"run #{again.id} " in launched.stdout
        # Other tests share this installation: the request of this run.
        [request] = [
            rory.approval(a.id) for a in rory.approvals() if rory.approval(a.id).run == again.id
        ]
        facts = {fact["fact"]: fact for fact in request.facts}
        assert facts["amount"]["value"] == amount
        assert facts["payee"]["value"] == "DE97 2004 0060 0123 4567 89"
        assert facts["reference"]["value"] == invoice.number
        assert all(fact["on_page"] for fact in facts.values())

        with pytest.raises(ApiError) as stale:
            rory.decide(request.id, approve=True, evidence_sha256="0" * 64)
        assert stale.value.status == 409
        shown = command(stack, reviewer_token, "approval", str(request.id))
        assert f"Amount: {amount} EUR" in shown.stdout
        assert request.evidence_sha256 in shown.stdout
        decided = command(
            stack, reviewer_token, "decide", str(request.id), "--approve",
            "--evidence", request.evidence_sha256,
        )  # fmt: skip
        assert decided.returncode == 0, decided
        assert f"approval #{request.id}: approved" in decided.stdout

        run = operator.wait(again.id, until={"succeeded", "failed", "cancelled"}, timeout=300)
        assert run.status == "succeeded", (run.failure_reason, stack.log_tail())
        assert str(run.outputs["receipt"]).startswith("RCPT-")

        # The run's whole history from the event stream, from its first event, in order.
        seen: list[tuple[str, object]] = []
        for event in operator.events(runs=[run.id], last_event_id="0"):
            seen.append((event.type, event.data.get("status")))
            if event.type == "run.status" and event.data.get("status") == "succeeded":
                break
        kinds = [kind for kind, _ in seen]
        assert kinds.count("step") == len(run.raw["steps"]), seen
        assert ("run.status", "running") in seen

    bundle = tmp_path / "evidence.zip"
    fetched = command(stack, operator_token, "bundle", str(run.id), str(bundle))
    assert fetched.returncode == 0, fetched
    with zipfile.ZipFile(bundle) as archive:
        assert "SHA256SUMS" in archive.namelist()
