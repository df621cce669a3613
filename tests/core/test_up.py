from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from pytest_django.fixtures import Settings

from pandaweb.core.management.commands.up import served_environment
from workflows.management.commands.demo_workflow import EXAMPLES, demo_workflows_aim
from workflows.models import Workflow, WorkflowVersion


def test_the_dashboard_address_follows_the_port_served() -> None:
    assert served_environment({}, "127.0.0.1", 8200, 8201) == {
        "PANDAWEB_PORT": "8200",
        "PANDAWEB_BASE_URL": "http://127.0.0.1:8200",
        "PANDAWEB_DEMO_PORTAL_URL": "http://127.0.0.1:8201/",
    }


def test_a_wildcard_bind_is_announced_by_its_loopback_address() -> None:
    assert served_environment({}, "0.0.0.0", 8200, None)["PANDAWEB_BASE_URL"] == (  # noqa: S104
        "http://127.0.0.1:8200"
    )
    assert served_environment({}, "::", 8200, None)["PANDAWEB_BASE_URL"] == "http://[::1]:8200"


def test_a_configured_public_address_is_kept() -> None:
    served = served_environment(
        {"PANDAWEB_BASE_URL": "https://pandaweb.example.com"}, "127.0.0.1", 8200, None
    )

    assert served == {"PANDAWEB_PORT": "8200"}


def latest(slug: str) -> WorkflowVersion:
    return WorkflowVersion.objects.filter(
        workflow__slug=slug, status=WorkflowVersion.Status.PUBLISHED
    ).latest("number")


def hosts(version: WorkflowVersion) -> list[str]:
    return list((version.document or {})["settings"]["allowed_hosts"])


@pytest.fixture
def demo_loaded(db: None) -> None:
    call_command("setup_roles", "--demo-users", verbosity=0, stdout=io.StringIO())
    call_command("demo_workflow", stdout=io.StringIO())


def test_a_start_on_another_portal_port_publishes_demo_versions_aimed_at_it(
    demo_loaded: None,
) -> None:
    first = {slug: latest(slug) for slug in EXAMPLES}

    lines = demo_workflows_aim(portal="127.0.0.1:9123")

    assert len(lines) == len(EXAMPLES)
    for slug, before in first.items():
        after = latest(slug)
        assert after.number == (before.number or 0) + 1
        assert hosts(after) == ["127.0.0.1:9123"]
        assert "127.0.0.1:8001" not in json.dumps(after.document)
        assert "127.0.0.1:9123" in json.dumps(after.steps)
        before.refresh_from_db()
        assert hosts(before) == ["127.0.0.1:8001"]
    assert list(
        Workflow.objects.filter(slug__in=EXAMPLES).values_list("allowed_hosts", flat=True)
    ) == [["127.0.0.1:9123"]] * len(EXAMPLES)


def test_a_start_on_the_same_port_publishes_nothing(demo_loaded: None) -> None:
    count = WorkflowVersion.objects.count()

    demo_workflows_aim(portal="127.0.0.1:8001")

    assert WorkflowVersion.objects.count() == count


def test_a_demo_workflow_with_unpublished_edits_is_left_alone(demo_loaded: None) -> None:
    slug = next(iter(EXAMPLES))
    workflow = Workflow.objects.get(slug=slug)
    WorkflowVersion.objects.create(workflow=workflow, steps=[], parameters=[])

    lines = demo_workflows_aim(portal="127.0.0.1:9123")

    assert hosts(latest(slug)) == ["127.0.0.1:8001"]
    assert WorkflowVersion.objects.get(workflow=workflow, status="draft").steps == []
    assert f"demo workflow '{slug}' left aimed at 127.0.0.1:8001: it has an unpublished draft" in (
        lines
    )


def test_loading_the_demo_again_follows_the_configured_portal(
    demo_loaded: None, settings: Settings
) -> None:
    settings.DEMO_PORTAL_URL = "http://127.0.0.1:9124/"

    call_command("demo_workflow", stdout=io.StringIO())

    for slug in EXAMPLES:
        assert hosts(latest(slug)) == ["127.0.0.1:9124"]
