"""The step form offers an irreversible step's expected outcome and a click's dialog, and
publishing refuses an irreversible step that does not say how the portal shows success."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.workflows.conftest import EXAMPLE
from workflows import services
from workflows.models import Credential, Workflow

pytestmark = pytest.mark.django_db

SUBMIT_INDEX = 13  # the demo workflow's "submit-payment"


@pytest.fixture
def workflow(operator: User, acme_credential: Credential) -> Workflow:
    workflow = services.workflow_import(user=operator, text=EXAMPLE.read_bytes())
    services.workflow_publish(workflow_id=workflow.pk, user=operator, message="v1")
    return workflow


@pytest.fixture
def client(operator: User) -> Client:
    client = Client()
    client.force_login(operator)
    return client


def test_the_step_form_shows_the_expected_outcome_of_an_irreversible_step(
    client: Client, workflow: Workflow
) -> None:
    body = client.get(f"/workflows/{workflow.slug}/steps/{SUBMIT_INDEX}/edit/").content.decode()

    assert '<option value="url" selected>the address matches</option>' in body
    assert 'name="expect_value" value="**/receipts/*"' in body
    assert 'name="dialog"' in body


def test_an_irreversible_click_is_saved_with_its_outcome_and_dialog(
    client: Client, workflow: Workflow
) -> None:
    response = client.post(
        f"/workflows/{workflow.slug}/steps/add/",
        {
            "type": "click",
            "id": "remove",
            "target": 'button "Remove supplier"',
            "irreversible": "on",
            "expect_kind": "target",
            "expect_value": 'heading "Supplier removed"',
            "dialog": "accept",
            "prompt_text": "REMOVE",
            "timeout_ms": 10000,
        },
    )

    assert response.status_code == 302, response.content.decode()
    draft = workflow.versions.get(status="draft")
    assert draft.steps[-1] == {
        "id": "remove",
        "type": "click",
        "irreversible": True,
        "expect": {"target": {"role": "heading", "name": "Supplier removed"}},
        "target": {"role": "button", "name": "Remove supplier"},
        "dialog": "accept",
        "prompt_text": "REMOVE",
    }


def test_an_expected_outcome_without_its_value_comes_back_with_an_error(
    client: Client, workflow: Workflow
) -> None:
    response = client.post(
        f"/workflows/{workflow.slug}/steps/add/",
        {
            "type": "click",
            "id": "remove",
            "target": 'button "Remove supplier"',
            "irreversible": "on",
            "expect_kind": "text",
            "timeout_ms": 10000,
        },
    )

    assert response.status_code == 200
    assert "give the expected text" in response.content.decode()
    assert not workflow.versions.filter(status="draft").exists()


def test_publishing_refuses_an_irreversible_step_without_an_expected_outcome(
    client: Client, workflow: Workflow
) -> None:
    client.post(
        f"/workflows/{workflow.slug}/steps/add/",
        {
            "type": "click",
            "id": "remove",
            "target": 'button "Remove supplier"',
            "irreversible": "on",
            "timeout_ms": 10000,
        },
    )

    response = client.post(f"/workflows/{workflow.slug}/publish/", {"message": "v2"}, follow=True)

    body = response.content.decode()
    assert "an irreversible step must say how the portal shows that it worked" in body
    assert "step 18 &#x27;remove&#x27;, field expect" in body
    assert workflow.versions.filter(status="published").count() == 1
