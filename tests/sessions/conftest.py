from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from pandaweb.core.roles import Role
from tests.factories import user_with_role
from tests.patching import patch_dispatch
from workflows import services as workflow_services
from workflows.models import Credential, Workflow

EXAMPLE = Path(__file__).resolve().parents[2] / "workflows" / "examples" / "acme-pay-invoice.yaml"
SESSION_EXAMPLE = EXAMPLE.with_name("acme-download-invoices.yaml")


@pytest.fixture(autouse=True)
def no_background_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Launching queues the run after commit; these tests execute runs themselves (or not)."""
    from sessions import services

    monkeypatch.setattr(services.runstate, "dispatch", lambda task, **kwargs: None)
    monkeypatch.setattr(services.templates, "dispatch", lambda task, **kwargs: None)


@pytest.fixture(autouse=True)
def session_templates_go_first(request: pytest.FixtureRequest) -> Iterator[None]:
    """Session templates pin published versions, which a transactional test's clean-up deletes
    (tests/conftest.py): the templates, and the runs' links to them, go first."""
    yield
    marker = request.node.get_closest_marker("django_db")
    if not (marker is not None and marker.kwargs.get("transaction", False)):
        return
    from sessions.models import Run, SessionTemplate

    Run.objects.exclude(session_template=None).update(session_template=None)
    SessionTemplate.objects.all().delete()


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


def session_document(portal_url: str) -> dict[str, Any]:
    """The session template example, pointed at a test portal."""
    host = portal_url.removeprefix("http://")
    document: dict[str, Any] = yaml.safe_load(
        SESSION_EXAMPLE.read_text().replace("127.0.0.1:8001", host)
    )
    return document


@pytest.fixture
def cdp_url(portal: str, tmp_path: Path) -> Iterator[str]:
    """A local sandbox's browser, allowed to reach the portal only, for the runner alone."""
    from sessions.engine.egress_policy import EgressPolicy
    from sessions.engine.proxy import EgressProxy
    from sessions.engine.sandbox.backends import get_backend
    from sessions.engine.sandbox.base import SandboxSpec

    backend = get_backend("local", settings.ENGINE_CONFIG)
    with EgressProxy(
        EgressPolicy([portal.removeprefix("http://")]), on_denied=lambda attempt: None
    ) as proxy:
        sandbox = backend.create(
            SandboxSpec(
                run_key=f"runner-{tmp_path.name[-8:]}", proxy_url=proxy.url, ttl_seconds=120
            )
        )
        try:
            yield sandbox.cdp_url
        finally:
            backend.destroy(sandbox)


@pytest.fixture
def runs_stay_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    """These runs are put in their failed state by hand: nothing executes them."""
    patch_dispatch(monkeypatch, lambda task, **kwargs: None)


@pytest.fixture
def author(operator: User) -> Client:
    client = Client()
    client.force_login(operator)
    return client
