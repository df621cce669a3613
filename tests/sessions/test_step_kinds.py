"""Every step kind has one module (its model, rules, sentence, editor fields and how it acts), and
every list of kinds is read off the registry: a kind of one's own is a module and one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import playwright.sync_api
import pytest

from sessions.engine import browser_errors
from sessions.engine import steps as step_kinds
from sessions.engine.steps.ask import AskStep
from tests.sessions.kinds import hover
from workflows.schema import SESSION_STEP_TYPES, STEP_CLASSES, STEP_LABELS, STEP_TYPES
from workflows.views import STEP_PALETTE

ROOT = Path(__file__).resolve().parents[2]


def test_every_kind_but_ask_acts_through_its_own_module() -> None:
    kinds = step_kinds.kinds()

    assert [kind.model for kind in kinds] == list(STEP_CLASSES)
    acting = [kind for kind in kinds if kind.model is not AskStep]
    assert all(kind.act is not None for kind in acting)
    modules = {kind.model.__module__ for kind in kinds}
    assert len(modules) == len(kinds), "two kinds share a module"
    for kind in acting:
        assert kind.act is not None
        assert kind.act.__module__ == kind.model.__module__
        assert kind.model.__module__.startswith("sessions.engine.steps.")


def test_the_palette_and_the_session_kinds_are_read_off_the_registry() -> None:
    assert [kind for kind, _ in STEP_PALETTE] == list(STEP_TYPES)
    assert dict(STEP_PALETTE) == STEP_LABELS
    assert set(SESSION_STEP_TYPES) < set(STEP_TYPES)
    assert {"extract", "download", "screenshot", "ask"}.isdisjoint(SESSION_STEP_TYPES)


def test_a_kind_registered_once_the_schema_is_built_is_refused_in_words() -> None:
    with pytest.raises(step_kinds.RegistryClosed, match=r"before workflows\.schema is imported"):
        step_kinds.register(hover.KIND)


def test_the_step_modules_use_playwright_s_own_error_classes() -> None:
    assert browser_errors.BrowserError is playwright.sync_api.Error
    assert browser_errors.BrowserTimeout is playwright.sync_api.TimeoutError


@pytest.mark.browser
def test_a_kind_of_one_s_own_is_one_module_and_one_registration(
    cdp_url: str, portal: str, tmp_path: Path
) -> None:
    # Its own process: a kind is registered at start-up, before the schema is built.
    clean = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    result = subprocess.run(
        [sys.executable, "-m", "tests.sessions.kinds.registered", cdp_url, portal, str(tmp_path)],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])

    assert seen["kinds"][-1] == "hover"
    assert seen["palette"] == "Hover over"
    assert seen["sentence"] == "Hover over the button 'Sign in'"
    assert seen["dumped"] is True
    assert seen["problems"] == []
    assert seen["broken"] == ["hover over what people see, not CSS"]
    assert seen["form"] == {
        "id": "point",
        "type": "hover",
        "irreversible": False,
        "timeout_ms": 10_000,
        "target": {"role": "button", "name": "Sign in"},
    }
    assert seen["outcome"] == "succeeded"
    assert seen["recorded"][1] == [
        "hover",
        "Hover over the button 'Sign in'",
        "succeeded",
        {"hovered": True},
    ]
