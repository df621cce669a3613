"""A model may rank healing candidates, when one is configured (off by default). It only proposes,
every call is in the audit trail, and no typed value or secret ever reaches it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from pytest_django.fixtures import Settings

from pandaweb.audit.models import AuditEvent
from sessions.models import StepResult
from tests.sessions.fake_model import FakeModel, fake_model_server
from tests.sessions.healing import REVIEW, failed_at
from workflows.models import Credential, Workflow

pytestmark = pytest.mark.usefixtures("runs_stay_queued")

TYPED = "CANARY-typed-IBAN-DE00"
NAMES = ["Check the payment", "Review payment later", "Payment review"]


@pytest.fixture
def model(settings: Settings) -> Iterator[FakeModel]:
    with fake_model_server() as (fake, url):
        settings.ASSIST_URL = url
        settings.ASSIST_MODEL = "fake-ranker"
        yield fake


def a_failed_review(operator: User, workflow: Workflow) -> str:
    run = failed_at(operator, workflow, REVIEW, "review", NAMES)
    result = StepResult.objects.get(run=run)
    # What the page held when the step failed: a field with a value this run typed.
    observation = dict(result.observation or {})
    observation["elements"] = [
        *observation["elements"],
        {"number": 9, "role": "textbox", "name": "IBAN", "value": TYPED, "interactive": True},
    ]
    observation["text"] = f'[9] textbox "IBAN" = "{TYPED}"'
    StepResult.objects.filter(pk=result.pk).update(observation=observation)
    return f"/runs/{run.pk}/steps/{REVIEW}/heal/"


def test_the_model_ranks_the_candidates_and_reads_no_typed_value_or_secret(
    operator: User,
    demo_workflow: Workflow,
    acme_credential: Credential,
    author: Client,
    model: FakeModel,
    run_files_in_tmp: Path,
) -> None:
    url = a_failed_review(operator, demo_workflow)
    before = author.get(url).content.decode()
    assert "Ask the model to rank these" in before
    first = [before.index(f"“{name}”") for name in NAMES]

    page = author.post(url, {"field": "target", "action": "rank"}).content.decode()

    assert "Proposed by the model fake-ranker" in page
    # The fake answers the reverse of the order it was given.
    assert sorted(first, reverse=True) != first
    shown = [page.index(f"“{name}”") for name in NAMES]
    assert sorted(range(3), key=lambda i: shown[i]) == sorted(range(3), key=lambda i: -first[i])
    [request] = model.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["model"] == "fake-ranker"
    prompt = "\n".join(m["content"] for m in request["messages"])
    # Canaries: what the run typed, its inputs, the credential's values.
    for secret in (TYPED, "portal-demo-2026", "acme-demo", "12.00", "INV-1001"):
        assert secret not in prompt
    assert "the button 'Review payment'" in prompt
    event = AuditEvent.objects.get(action="assist.model_called")
    assert event.actor == operator
    assert event.after is not None
    assert event.after["prompt_chars"] == len(request["messages"][-1]["content"])
    assert event.after["answer"].startswith('{"order": [')


def test_a_failing_model_leaves_the_order_and_says_so(
    operator: User,
    demo_workflow: Workflow,
    author: Client,
    model: FakeModel,
    run_files_in_tmp: Path,
) -> None:
    url = a_failed_review(operator, demo_workflow)
    model.failing = True

    page = author.post(url, {"field": "target", "action": "rank"})

    assert page.status_code == 400
    assert "Nothing was proposed: the model at" in page.content.decode()
    event = AuditEvent.objects.get(action="assist.model_called")
    assert event.after is not None
    assert "overloaded" in event.after["error"]


def test_assistance_is_off_by_default(
    operator: User, demo_workflow: Workflow, author: Client, run_files_in_tmp: Path
) -> None:
    url = a_failed_review(operator, demo_workflow)

    assert "Ask the model" not in author.get(url).content.decode()
    page = author.post(url, {"field": "target", "action": "rank"})
    assert "no model is configured (PANDAWEB_ASSIST_URL)" in page.content.decode()
    assert not AuditEvent.objects.filter(action="assist.model_called").exists()


def test_a_description_is_matched_to_an_element_of_the_page_only(
    operator: User,
    demo_workflow: Workflow,
    author: Client,
    model: FakeModel,
    run_files_in_tmp: Path,
) -> None:
    url = a_failed_review(operator, demo_workflow)

    page = author.post(
        url, {"field": "target", "action": "describe", "description": "payment review"}
    ).content.decode()

    first = page.index('<li class="card">')
    assert page.index("[3] button “Payment review”", first) < page.index("“Check the payment”")
    assert "the model&#x27;s choice for &#x27;payment review&#x27;" in page
    [request] = model.requests
    prompt = request["messages"][-1]["content"]
    assert '[9] textbox "IBAN"' in prompt
    assert TYPED not in prompt
    event = AuditEvent.objects.get(action="assist.model_called")
    assert event.after is not None
    assert event.after["purpose"] == "choose an element"

    made_up = author.post(
        url, {"field": "target", "action": "describe", "description": "the pink elephant"}
    )
    assert made_up.status_code == 400
    assert "Nothing was proposed: the model named no element of the page for &#x27;the pink" in (
        made_up.content.decode()
    )


def test_the_model_s_pick_is_used_and_pictured_even_when_no_rule_proposed_it(
    operator: User,
    demo_workflow: Workflow,
    author: Client,
    model: FakeModel,
    run_files_in_tmp: Path,
) -> None:
    run = failed_at(operator, demo_workflow, REVIEW, "review", ["Back", "Continue"])
    url = f"/runs/{run.pk}/steps/{REVIEW}/heal/"
    assert "“Continue”" not in author.get(url).content.decode()

    page = author.post(url, {"field": "target", "action": "describe", "description": "continue"})

    assert "[2] button “Continue”" in page.content.decode()
    assert author.get(f"{url}2.png")["Content-Type"] == "image/png"
    author.post(url, {"field": "target", "number": 2})
    draft = demo_workflow.versions.get(status="draft")
    assert next(s for s in draft.steps if s["id"] == "review")["target"]["name"] == "Continue"


def test_a_run_input_echoed_by_the_page_reaches_the_model_as_its_reference(
    operator: User,
    demo_workflow: Workflow,
    author: Client,
    model: FakeModel,
    run_files_in_tmp: Path,
) -> None:
    run = failed_at(operator, demo_workflow, REVIEW, "review", ["Pay INV-1001", "Review INV-1001"])

    author.post(
        f"/runs/{run.pk}/steps/{REVIEW}/heal/",
        {"field": "target", "action": "describe", "description": "the review button"},
    )

    prompt = model.requests[0]["messages"][-1]["content"]
    assert "INV-1001" not in prompt
    assert '[2] button "Review {{ params.invoice }}"' in prompt


@pytest.mark.django_db(transaction=True)
def test_a_model_call_is_audited_outside_any_test_transaction(
    operator: User, demo_workflow: Workflow, model: FakeModel, run_files_in_tmp: Path
) -> None:
    # Requests are not wrapped in a transaction: the audit event opens its own.
    client = Client()
    client.force_login(operator)
    url = a_failed_review(operator, demo_workflow)

    page = client.post(url, {"field": "target", "action": "rank"})

    assert page.status_code == 200
    assert AuditEvent.objects.filter(action="assist.model_called").count() == 1
