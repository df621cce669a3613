"""What a run says, in words people act on: resolved values, the element that covers a target,
usernames shown and secrets masked, a modal's text. The runner drives a local sandbox (system
Chromium) through the egress proxy against the bundled demo portal on loopback."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any, cast

import pytest
from PIL import Image
from playwright.sync_api import Locator, Page

from pandaweb.demo_portal.server import PortalServer
from pandaweb.demo_portal.state import DEMO_PASSWORD, DEMO_USERNAME
from sessions.engine import recording
from sessions.engine.locating import COVERED_BY
from sessions.engine.plan import RunOutcome, RunPlan
from sessions.engine.runner import Runner
from sessions.engine.vocabulary import MASK

pytestmark = pytest.mark.browser

SEED = "JBSWY3DPEHPK3PXP"
SECRETS = {
    "acme": {"username": DEMO_USERNAME, "password": DEMO_PASSWORD},
    "otp": {"seed": SEED},
}


class RecordingSink:
    def __init__(self) -> None:
        self.records: list[Any] = []

    def step_finished(self, record: Any) -> None:
        # What the run's writer does first: build the observation the runner took.
        recording.finish(record)
        self.records.append(record)

    def action_starting(self, index: int) -> None:
        raise AssertionError("no approved action in these tests")

    def action_finished(self, index: int, result: str = "") -> None:
        raise AssertionError("no approved action in these tests")

    def action_refused(self, index: int, reason: str) -> None:
        raise AssertionError("no approved action in these tests")

    def stop_reason(self) -> str | None:
        return None


def run(
    cdp_url: str, tmp_path: Path, steps: list[dict[str, Any]], inputs: dict[str, Any]
) -> tuple[RunOutcome, RecordingSink]:
    plan = RunPlan(
        steps=steps,
        inputs=inputs,
        secrets=SECRETS,
        step_budget=50,
        deadline=time.time() + 90,
        artifacts_dir=tmp_path / "artifacts",
    )
    sink = RecordingSink()
    return Runner(plan, sink).run(cdp_url), sink


def field_value(record: Any, name: str) -> str | None:
    return next(e["value"] for e in record.observation["elements"] if e["name"] == name)


def shows_mask(record: Any, name: str) -> bool:
    """Whether the step's picture is painted in the mask colour at the middle of field ``name``."""
    box = next(e["box"] for e in record.observation["elements"] if e["name"] == name)
    image = Image.open(io.BytesIO(record.screenshot)).convert("RGB")
    pixel = image.getpixel((box["x"] + box["width"] / 2, box["y"] + box["height"] / 2))
    assert isinstance(pixel, tuple)
    return all(abs(have - want) <= 16 for have, want in zip(pixel, (255, 0, 255), strict=True))


def test_a_click_under_a_consent_dialog_says_what_covers_it(
    cdp_url: str, portal: str, tmp_path: Path
) -> None:
    steps: list[dict[str, Any]] = [
        {"id": "login-page", "type": "goto", "url": f"{portal}/login"},
        {"id": "type-code", "type": "fill", "target": {"label": "Username"},
         "value": "{{ secrets.otp.code }}"},
        {"id": "type-user", "type": "fill", "target": {"label": "Username"},
         "value": "{{ secrets.acme.username }}"},
        {"id": "type-password", "type": "fill", "target": {"label": "Password"},
         "value": "{{ secrets.acme.password }}"},
        {"id": "sign-in", "type": "click", "target": {"role": "button", "name": "Sign in"}},
        {"id": "review", "type": "goto", "url": f"{portal}/lab/consent"},
        {"id": "continue", "type": "click", "timeout_ms": 1500,
         "target": {"role": "button", "name": "{{ params.next }}"}},
    ]  # fmt: skip

    outcome, sink = run(cdp_url, tmp_path, steps, {"next": "Continue"})

    _, code, user, password, _, review, click = sink.records
    assert outcome.status == "failed"
    assert click.sentence == "Click the button 'Continue'"
    assert click.error == (
        f"a dialog 'We value your privacy' covers the button 'Continue' on {portal}/lab/consent"
    )
    assert outcome.reason == click.error
    # The username may show where it was typed; the one-time code and the password never.
    assert field_value(code, "Username") == MASK
    assert field_value(user, "Username") == DEMO_USERNAME
    assert field_value(password, "Password") == MASK
    # In the pictures too: the field holding the code, and the password field, are painted over.
    assert shows_mask(code, "Username")
    assert not shows_mask(user, "Username")
    assert shows_mask(password, "Password")
    assert (
        user.sentence == "Fill the field labelled 'Username' with the username of credential 'acme'"
    )
    assert password.sentence == "Fill the field labelled 'Password' with a secret"
    everything = json.dumps([(r.sentence, r.error, r.observation) for r in sink.records])
    assert DEMO_PASSWORD not in everything
    assert "{{" not in everything
    # The open modal is observed with its words, not only its buttons.
    text = review.observation["text"]
    assert 'dialog "We value your privacy"' in text
    assert "Acme Procurement GmbH and its 3 partners store cookies" in text
    assert "[" in text.split("Acme Procurement GmbH", 1)[1]  # its buttons follow


def test_messages_and_the_approval_evidence_show_the_run_s_values(
    cdp_url: str, portal: str, portal_server: PortalServer, tmp_path: Path
) -> None:
    invoice = next(i for i in portal_server.state.invoices() if i.status == "open").number
    steps: list[dict[str, Any]] = [
        {"id": "login-page", "type": "goto", "url": f"{portal}/login"},
        {"id": "log-in", "type": "login", "credential": "acme",
         "username": {"label": "Username"}, "password": {"label": "Password"},
         "submit": {"role": "button", "name": "Sign in"}},
        {"id": "settle", "type": "wait", "seconds": 1},
        {"id": "invoices", "type": "goto", "url": f"{portal}/invoices"},
        {"id": "open", "type": "click", "irreversible": True,
         "target": {"role": "link", "name": "{{ params.invoice }}"}},
    ]  # fmt: skip

    outcome, sink = run(cdp_url, tmp_path, steps, {"invoice": invoice})

    assert outcome.status == "approval_required", outcome.reason
    wait = sink.records[2]
    assert (wait.sentence, wait.status) == ("Wait 1 second", "succeeded")
    assert wait.duration_ms >= 1000
    assert outcome.gate is not None
    evidence = outcome.gate.evidence
    assert evidence["action"] == f"Click the link '{invoice}' on {portal}/invoices"
    assert evidence["target"]["description"] == f"the link '{invoice}'"


def test_a_missing_target_is_named_with_the_run_s_value(
    cdp_url: str, portal: str, tmp_path: Path
) -> None:
    steps: list[dict[str, Any]] = [
        {"id": "login-page", "type": "goto", "url": f"{portal}/login"},
        {"id": "open", "type": "click", "timeout_ms": 1000,
         "target": {"role": "link", "name": "{{ params.invoice }}"}},
    ]  # fmt: skip

    outcome, sink = run(cdp_url, tmp_path, steps, {"invoice": "INV-1040"})

    assert outcome.status == "failed"
    assert sink.records[1].sentence == "Click the link 'INV-1040'"
    assert outcome.reason == f"no link named 'INV-1040' on {portal}/login"


def covered_by(page: Page, target: Locator, *, framed: bool = False) -> dict[str, str] | None:
    """What the runner finds over ``target``: in its own frame, then, in an iframe, on the page."""
    found = target.evaluate(COVERED_BY, None)
    if found is None and framed:
        box = target.bounding_box()
        assert box is not None
        middle = [box["x"] + box["width"] / 2, box["y"] + box["height"] / 2]
        found = page.evaluate(f"point => ({COVERED_BY})(null, point)", middle)
    return cast(dict[str, str] | None, found)


def test_what_covers_a_target_is_found_through_frames_shadow_roots_and_native_dialogs(
    page: Page,
) -> None:
    page.set_content(
        """<iframe id="form" srcdoc="<button style='margin:40px'>Save</button>"
             style="width:400px;height:200px"></iframe>
        <div role="dialog" aria-label="Session expires soon"
             style="position:fixed;inset:0;background:rgba(0,0,0,.3)">
          <p>Stay signed in?</p></div>"""
    )
    save = page.frame_locator("#form").get_by_role("button", name="Save")
    save.wait_for()
    assert covered_by(page, save) is None  # nothing inside the frame itself
    assert covered_by(page, save, framed=True) == {
        "kind": "dialog",
        "name": "Session expires soon",
    }

    page.set_content(
        """<button>Go</button><dialog open style="position:fixed;inset:0;margin:0;width:100%;
        height:100%"><h2>Update available</h2><button>Later</button></dialog>"""
    )
    assert covered_by(page, page.get_by_role("button", name="Go")) == {
        "kind": "dialog",
        "name": "Update available",
    }

    page.set_content(
        """<div id="host"></div><script>document.getElementById("host").attachShadow(
        {mode: "open"}).innerHTML = '<button>Apply</button><div class="veil" '
        + 'style="position:fixed;inset:0"></div>';</script>"""
    )
    assert covered_by(page, page.get_by_role("button", name="Apply")) == {
        "kind": "element",
        "name": "<div.veil>",
    }

    page.set_content("<button>Go</button>")
    assert covered_by(page, page.get_by_role("button", name="Go")) is None
