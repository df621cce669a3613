from __future__ import annotations

from tests.sessions.conftest import acme_credential, demo_workflow, no_background_runs, operator

__all__ = ["acme_credential", "demo_workflow", "no_background_runs", "operator"]
