from __future__ import annotations

# Runs are launched and executed by the tests themselves, with the sessions tests' fixtures.
from tests.sessions.conftest import acme_credential, demo_workflow, no_background_runs, operator

__all__ = ["acme_credential", "demo_workflow", "no_background_runs", "operator"]
