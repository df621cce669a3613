"""The check before an approved irreversible action: the runner acts only while the page shows
what the reviewers approved, and reads for it exactly what the evidence comparison looks at. A
local sandbox (system Chromium) behind the egress proxy, the bundled demo portal on loopback."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from pandaweb.demo_portal.server import PortalServer
from pandaweb.demo_portal.state import DEMO_PASSWORD, DEMO_USERNAME
from sessions.engine import observation, recording
from sessions.engine.driver import with_browser
from sessions.engine.plan import Gate, RunOutcome, RunPlan
from sessions.engine.runner import Runner
from tests.demo_portal.conftest import fetch_json

pytestmark = pytest.mark.browser

SECRETS = {"acme": {"username": DEMO_USERNAME, "password": DEMO_PASSWORD}}


def pay_steps(portal: str) -> list[dict[str, Any]]:
    return [
        {"id": "open-login", "type": "goto", "url": f"{portal}/login"},
        {"id": "log-in", "type": "login", "credential": "acme",
         "username": {"label": "Username"}, "password": {"label": "Password"},
         "submit": {"role": "button", "name": "Sign in"}},
        {"id": "wait-dashboard", "type": "wait_for", "text": "Open invoices"},
        {"id": "accept-cookies", "type": "click", "target": {"role": "button", "name": "Accept"}},
        {"id": "open-pay-form", "type": "goto",
         "url": f"{portal}/invoices/{{{{ params.invoice }}}}/pay"},
        {"id": "fill-amount", "type": "fill", "target": {"label": "Amount"},
         "value": "{{ params.amount }}"},
        {"id": "fill-iban", "type": "fill", "target": {"label": "IBAN"},
         "value": "{{ params.iban }}"},
        {"id": "review", "type": "click", "target": {"role": "button", "name": "Review payment"}},
        {"id": "submit-payment", "type": "click", "irreversible": True,
         "expect": {"url": "**/receipts/*"},
         "target": {"role": "button", "name": "Submit payment"}},
    ]  # fmt: skip


class ActionSink:
    def __init__(self) -> None:
        self.records: list[Any] = []
        self.actions: list[str] = []

    def step_finished(self, record: Any) -> None:
        recording.finish(record)
        self.records.append(record)

    def action_starting(self, index: int) -> None:
        self.actions.append("intent")

    def action_finished(self, index: int, result: str = "") -> None:
        self.actions.append("completion")

    def action_refused(self, index: int, reason: str) -> None:
        self.actions.append("refused")

    def stop_reason(self) -> str | None:
        return None


class Payment:
    """The demo flow up to its gate, then continuations approved on the gate's evidence."""

    def __init__(self, cdp_url: str, portal: str, server: PortalServer, tmp_path: Path) -> None:
        self.cdp_url = cdp_url
        self.steps = pay_steps(portal)
        invoice = next(i for i in server.state.invoices() if i.status == "open")
        self.inputs = {
            "invoice": invoice.number,
            "amount": f"{invoice.amount_due:.2f}",
            "iban": "DE97 2004 0060 0123 4567 89",
        }
        self.tmp_path = tmp_path

    def plan(self, **approved: Any) -> RunPlan:
        return RunPlan(
            steps=self.steps,
            inputs=self.inputs,
            secrets=SECRETS,
            step_budget=50,
            deadline=time.time() + 90,
            artifacts_dir=self.tmp_path / "artifacts",
            **approved,
        )

    def to_the_gate(self) -> Gate:
        outcome = Runner(self.plan(), ActionSink()).run(self.cdp_url)
        assert outcome.status == "approval_required", outcome.reason
        assert outcome.gate is not None
        return outcome.gate

    def approved(self, gate: Gate) -> tuple[RunOutcome, ActionSink]:
        index = gate.evidence["step_index"]
        plan = self.plan(start_index=index, approved_index=index, approved_evidence=gate.evidence)
        sink = ActionSink()
        return Runner(plan, sink).run(self.cdp_url), sink

    def on_page(self, script: str) -> None:
        """Change the waiting page the way the portal (or someone) could."""
        with_browser(self.cdp_url, lambda browser: browser.contexts[0].pages[-1].evaluate(script))


@pytest.fixture
def payment(cdp_url: str, portal: str, portal_server: PortalServer, tmp_path: Path) -> Payment:
    return Payment(cdp_url, portal, portal_server, tmp_path)


@pytest.fixture
def full_evidence_taken(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every page the runner observed for approval evidence (the observation and the pictures
    of a new request)."""
    seen: list[str] = []
    real = observation.capture

    def capture(page: Any, **kwargs: Any) -> Any:
        seen.append(page.url)
        return real(page, **kwargs)

    monkeypatch.setattr(observation, "capture", capture)
    return seen


def test_an_unchanged_page_is_acted_on_without_new_pictures(
    payment: Payment, portal: str, full_evidence_taken: list[str]
) -> None:
    gate = payment.to_the_gate()
    assert len(full_evidence_taken) == 1

    outcome, sink = payment.approved(gate)

    assert outcome.status == "succeeded", outcome.reason
    assert sink.actions == ["intent", "completion"]
    assert len(fetch_json(f"{portal}/api/payments")) == 1
    # The comparison needs no observation and no screenshot: the reviewer is waiting.
    assert len(full_evidence_taken) == 1


CHANGES: dict[str, tuple[str, str]] = {
    "the form the button submits": (
        "document.querySelector('form.actions').setAttribute('action', '/elsewhere')",
        "the target's form_action changed: '/invoices/",
    ),
    "the address": (
        "history.replaceState(null, '', location.pathname + '?step=2')",
        "the address changed: ",
    ),
    "a value the run typed": (
        "document.querySelector('form.actions').insertAdjacentHTML('beforebegin',"
        " '<label>Amount <input value=\"1.00\"></label>')",
        "the field labelled 'Amount' now holds '1.00', not None",
    ),
    "the page's text": (
        "document.querySelector('p.lead').textContent = 'Nothing is paid until tomorrow.'",
        "the page's text changed: ",
    ),
}


@pytest.mark.parametrize("what", list(CHANGES))
def test_a_page_that_changed_since_approval_is_asked_again_with_full_evidence(
    payment: Payment, portal: str, full_evidence_taken: list[str], what: str
) -> None:
    script, said = CHANGES[what]
    gate = payment.to_the_gate()
    payment.on_page(script)

    outcome, sink = payment.approved(gate)

    assert outcome.status == "approval_required", outcome.reason
    assert sink.actions == []
    assert fetch_json(f"{portal}/api/payments") == []
    assert outcome.gate is not None
    assert any(said in change for change in outcome.gate.changes), outcome.gate.changes
    # The new request shows the reviewers the page as it is now.
    assert len(full_evidence_taken) == 2
    assert outcome.gate.screenshot.startswith(b"\x89PNG")
    assert outcome.gate.evidence["observation"]["elements"]
    assert outcome.gate.evidence["target"]["box"]


def test_a_target_that_became_ambiguous_is_never_clicked(payment: Payment, portal: str) -> None:
    gate = payment.to_the_gate()
    payment.on_page(
        "document.querySelector('form.actions').insertAdjacentHTML('afterend',"
        " '<button>Submit payment</button>')"
    )

    outcome, sink = payment.approved(gate)

    assert outcome.status == "failed"
    assert outcome.reason.startswith("could not gather the approval evidence for step 9: ")
    assert "2 elements match the button 'Submit payment'" in outcome.reason
    assert sink.actions == []
    assert fetch_json(f"{portal}/api/payments") == []
