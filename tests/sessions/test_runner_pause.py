"""The runner's pause between steps: a person's take-over is shown with the next irreversible
step's evidence, and an approval given before it no longer covers the action."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.conf import settings

from pandaweb.demo_portal.state import DEMO_PASSWORD, DEMO_USERNAME
from sessions.engine.egress_policy import EgressPolicy
from sessions.engine.plan import HandBack, RunOutcome, RunPlan
from sessions.engine.proxy import EgressProxy
from sessions.engine.runner import Runner
from sessions.engine.sandbox.backends import get_backend
from sessions.engine.sandbox.base import Sandbox, SandboxSpec
from tests.sessions.test_runner import RecordingSink

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SECRETS = {"acme-portal": {"username": DEMO_USERNAME, "password": DEMO_PASSWORD}}
TOOK_OVER = HandBack(by="olivia.operator", inputs=2, navigated=False, typed=True)


class Pause:
    """Hands the browser back with ``hand_back`` before step ``at``; None everywhere else."""

    def __init__(
        self,
        at: int | None,
        hand_back: HandBack = TOOK_OVER,
        meanwhile: Callable[[], object] = lambda: None,
    ) -> None:
        self.at = at
        self.hand_back = hand_back
        self.meanwhile = meanwhile
        self.asked: list[int] = []
        self.deadlines: list[float] = []

    def hold(self, index: int, stop: Callable[[], str | None], deadline: float) -> HandBack | None:
        self.asked.append(index)
        self.deadlines.append(deadline)
        if index != self.at:
            return None
        self.meanwhile()
        return self.hand_back


@pytest.fixture
def sandbox(portal: str, tmp_path: Path) -> Iterator[Sandbox]:
    backend = get_backend("local", settings.ENGINE_CONFIG)
    with EgressProxy(EgressPolicy([portal.removeprefix("http://")]), on_denied=lambda a: None) as p:
        created = backend.create(
            SandboxSpec(run_key=f"pause-{tmp_path.name[-8:]}", proxy_url=p.url, ttl_seconds=120)
        )
        try:
            yield created
        finally:
            backend.destroy(created)


def run(
    sandbox: Sandbox, portal: str, tmp_path: Path, pause: Pause, deadline: float = 0, **plan: Any
) -> RunOutcome:
    steps: list[dict[str, Any]] = [
        {"id": "open-login", "type": "goto", "url": f"{portal}/login"},
        {
            "id": "log-in", "type": "login", "credential": "acme-portal",
            "username": {"label": "Username"}, "password": {"label": "Password"},
            "submit": {"role": "button", "name": "Sign in"},
        },
        {"id": "open", "type": "goto", "url": f"{portal}/lab/approvals/INV-1034"},
        {
            "id": "approve", "type": "click", "irreversible": True,
            "target": {"role": "button", "name": "Approve invoice"},
            "expect": {"text": "approved for payment"},
        },
    ]  # fmt: skip
    return Runner(
        RunPlan(
            steps=steps,
            inputs={},
            secrets=SECRETS,
            step_budget=10,
            deadline=deadline or time.time() + 90,
            artifacts_dir=tmp_path,
            **plan,
        ),
        RecordingSink(),
        pause=pause,
    ).run(sandbox.cdp_url)


def test_a_take_over_is_in_the_evidence_and_voids_an_earlier_approval(
    sandbox: Sandbox, portal: str, tmp_path: Path
) -> None:
    first = run(sandbox, portal, tmp_path, Pause(at=3))
    assert first.status == "approval_required", first.reason
    assert first.gate is not None
    assert first.gate.evidence["operators"] == [
        {"by": "olivia.operator", "inputs": 2, "navigated": False, "typed": True, "urls": []}
    ]

    # Approved, then taken over just before the action: the reviewers' approval no longer holds.
    approved: dict[str, Any] = {
        "start_index": 3,
        "approved_index": 3,
        "approved_evidence": first.gate.evidence,
    }
    pause = Pause(at=3)
    again = run(sandbox, portal, tmp_path, pause, **approved)
    assert again.status == "approval_required"
    assert pause.asked == [3]

    # Without a take-over the same approval lets the action happen.
    done = run(sandbox, portal, tmp_path, Pause(at=None), **approved)
    assert done.status == "succeeded", done.reason


def test_the_runs_time_limit_reached_while_a_person_had_control_ends_the_run(
    sandbox: Sandbox, portal: str, tmp_path: Path
) -> None:
    deadline = time.time() + 90
    with time_machine.travel(time.time(), tick=True) as traveller:
        # The person is still in control when the time limit passes.
        pause = Pause(at=2, meanwhile=lambda: traveller.shift(120))
        outcome = run(sandbox, portal, tmp_path, pause, deadline=deadline)

    assert (outcome.status, outcome.reason) == ("expired", "the run's time limit was reached")
    assert outcome.next_index == 2
    assert set(pause.deadlines) == {deadline}
