"""Fixtures shared by the chat, passkey and notification tests: a workflow whose requests go to
Slack, requests opened through ``approval_open`` as the gate opens them, and background work
run inline once the transaction commits."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone
from PIL import Image
from pytest_django.fixtures import Settings

from approvals import services as approvals
from approvals.models import ApprovalRequest
from sessions import services
from sessions.engine.plan import Gate
from sessions.models import Run
from tests.approvals.fake_slack import FakeSlack
from tests.sessions.conftest import EXAMPLE, publish
from workflows.models import Workflow

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
TEAM = "T0PANDA"
CHANNEL = "C0PAYMENTS"
INPUTS = {"invoice": "INV-1001", "amount": "1,250.00"}


def png(width: int = 900, height: int = 600) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (240, 240, 250)).save(out, format="PNG")
    return out.getvalue()


def reach_workflow(operator: User, **approval: Any) -> Workflow:
    document = yaml.safe_load(EXAMPLE.read_text())
    document["settings"]["approval"] = {"quorum": 1, **approval}
    return publish(operator, document)


def open_request(launcher: User, workflow: Workflow, *, quorum: int = 1) -> ApprovalRequest:
    """Launch a run, park it at its gate and open its request as the runner would."""
    run = services.run_launch(workflow_id=workflow.pk, user=launcher, raw_inputs=INPUTS)
    sandbox = {"backend": "local", "run_key": f"run-{run.pk}-x", "owner": {"node": ""}}
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.AWAITING_APPROVAL,
        sandbox=sandbox,
        deadline_at=timezone.now() + timedelta(minutes=9),
    )
    evidence = {
        "step_index": 13,
        "step_id": "submit-payment",
        "action": "Click the button 'Submit payment' on http://127.0.0.1:8001/invoices/INV-1001/pay",
        "filled": [{"field": "Amount", "value": "1,250.00", "step_id": "fill-amount"}],
        "inputs": dict(INPUTS),
        "outputs": {"total": INPUTS["amount"]},
        "url": "http://127.0.0.1:8001/invoices/INV-1001/pay",
        "title": "Pay INV-1001",
        "page_text": "Pay invoice INV-1001. Amount 1,250.00 EUR. Submit payment",
        "target": {
            "tag": "button",
            "text": "Submit payment",
            "description": "the button 'Submit payment'",
            "box": {"x": 400, "y": 300, "width": 120, "height": 32},
        },
    }
    with transaction.atomic():
        locked = services.lock_run(run.pk)
        approval = approvals.approval_open(run=locked, gate=Gate.of(evidence, png()), previous=None)
        if quorum != 1:
            approval.quorum = quorum
            approval.save(update_fields=["quorum"])
    return approval


@pytest.fixture
def fake_slack(settings: Settings, tmp_path: Any) -> Iterator[FakeSlack]:
    with FakeSlack() as fake:
        settings.SLACK_BOT_TOKEN = "xoxb-test-token"
        settings.SLACK_SIGNING_SECRET = SECRET
        settings.SLACK_API_URL = fake.url
        settings.RUN_FILES_DIR = tmp_path / "runs"
        yield fake


@pytest.fixture
def background(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Work queued after commit: approvals' chat tasks run inline; others (the continuation) are
    only recorded, as a test of the policy does not run the browser."""
    sent: list[dict[str, Any]] = []
    lock = threading.Lock()

    def send(task: Any, kwargs: dict[str, Any], queue: str | None) -> None:
        with lock:
            sent.append({"task": task.name, **kwargs})
        if task.name.startswith("approvals."):
            result = task.apply(kwargs=kwargs)
            assert not result.failed(), result.result

    monkeypatch.setattr("pandaweb.core.dispatch._send", send)
    return sent
