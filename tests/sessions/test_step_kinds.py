"""Every step kind the schema accepts has one home in the engine that acts on the page, and the
lists people see (the editor's palette, the kinds a session may use) come from the same union."""

from __future__ import annotations

from sessions.engine.steps import ACTIONS
from workflows.schema import SESSION_STEP_TYPES, STEP_CLASSES, STEP_LABELS, STEP_TYPES, AskStep
from workflows.views import STEP_PALETTE


def test_every_kind_but_ask_acts_through_its_own_module() -> None:
    acting = [cls for cls in STEP_CLASSES if cls is not AskStep]

    assert set(ACTIONS) == set(acting)
    modules = {ACTIONS[cls].__module__ for cls in acting}
    assert len(modules) == len(acting), "two kinds share a module"
    for module in modules:
        assert module.startswith("sessions.engine.steps.")


def test_the_palette_and_the_session_kinds_are_read_off_the_union() -> None:
    assert [kind for kind, _ in STEP_PALETTE] == list(STEP_TYPES)
    assert dict(STEP_PALETTE) == STEP_LABELS
    assert set(SESSION_STEP_TYPES) < set(STEP_TYPES)
    assert {"extract", "download", "screenshot", "ask"}.isdisjoint(SESSION_STEP_TYPES)
