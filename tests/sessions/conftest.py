from __future__ import annotations

from pathlib import Path

import psutil
import pytest
import yaml
from django.contrib.auth.models import User

from pandaweb.core.roles import Role
from tests.factories import user_with_role
from workflows import services as workflow_services
from workflows.models import Credential, Workflow

EXAMPLE = Path(__file__).resolve().parents[2] / "workflows" / "examples" / "acme-pay-invoice.yaml"


@pytest.fixture(autouse=True)
def no_background_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Launching queues the run after commit; these tests execute runs themselves (or not)."""
    from sessions import services

    monkeypatch.setattr(services, "dispatch", lambda task, **kwargs: None)


@pytest.fixture
def operator(db: None) -> User:
    return user_with_role(Role.OPERATORS, username="olivia")


def publish(user: User, document: dict[str, object]) -> Workflow:
    text = yaml.safe_dump({"pandaweb": 1, **document})
    workflow = workflow_services.workflow_import(user=user, text=text)
    workflow_services.workflow_publish(
        workflow_id=workflow.pk, user=user, message="test", accept_warnings=True
    )
    return workflow


@pytest.fixture
def acme_credential(operator: User) -> Credential:
    return workflow_services.credential_create(
        user=operator,
        name="acme-portal",
        kind="username_password",
        description="",
        values={"username": "acme-demo", "password": "portal-demo-2026"},
    )


@pytest.fixture
def demo_workflow(operator: User, acme_credential: Credential) -> Workflow:
    return publish(operator, yaml.safe_load(EXAMPLE.read_text()))


def processes_with(marker: str) -> list[psutil.Process]:
    """Live processes whose command line contains ``marker`` (a sandbox's run key or workdir)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in process.info["cmdline"] or []):
                found.append(process)
        except psutil.NoSuchProcess:
            continue
    return found
