"""A model may rank healing candidates, when one is configured (off by default). It only proposes;
the question is recorded and a worker asks it while the page waits; every call is in the audit
trail, and no typed value or secret ever reaches it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Task
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client
from pytest_django.fixtures import Settings

from pandaweb.assist import services as assist_services
from pandaweb.assist.models import ModelCall
from pandaweb.assist.tasks import model_call_task
from pandaweb.audit.models import AuditEvent
from pandaweb.core import dispatch as dispatcher
from pandaweb.core.roles import Role
from sessions.models import StepResult
from tests.factories import user_with_role
from tests.sessions.fake_model import FakeModel, fake_model_server
from tests.sessions.healing import REVIEW, failed_at
from workflows.models import Credential, Workflow

pytestmark = pytest.mark.usefixtures("runs_stay_queued")

TYPED = "CANARY-typed-IBAN-DE00"
NAMES = ["Check the payment", "Review payment later", "Payment review"]
# Bound before any fixture patches it: the real dispatcher, for the test that uses it.
REAL_DISPATCH = dispatcher.dispatch

Capture = Callable[..., Any]


@pytest.fixture
def model(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModel]:
    """A configured model, asked by its task in this process when the request's work commits
    (a test that wants it asked captures the on-commit callbacks)."""

    def in_process(task: Task, **kwargs: Any) -> None:
        transaction.on_commit(lambda: task.apply(kwargs=kwargs, throw=True))

    monkeypatch.setattr(assist_services, "dispatch", in_process)
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


def ask(client: Client, url: str, capture: Capture, **data: str) -> str:
    """Ask the model from the healing page and let its task run; the page the person is sent
    to, while it waits and once it is answered."""
    with capture(execute=True):
        asked = client.post(url, {"field": "target", **data})
    assert asked.status_code == 302, asked.content.decode()
    return str(asked["Location"])


def test_the_model_ranks_the_candidates_while_the_page_waits_and_reads_no_secret(
    operator: User,
    demo_workflow: Workflow,
    acme_credential: Credential,
    author: Client,
    model: FakeModel,
    run_files_in_tmp: Path,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    url = a_failed_review(operator, demo_workflow)
    before = author.get(url).content.decode()
    assert "Ask the model to rank these" in before
    first = [before.index(f"“{name}”") for name in NAMES]

    with django_capture_on_commit_callbacks() as queued:
        asked = author.post(url, {"field": "target", "action": "rank"})
    call = ModelCall.objects.get()
    assert asked["Location"] == f"{url}?field=target&call={call.pk}"
    assert (call.status, call.requested_by, call.purpose) == ("pending", operator, "rank")
    assert model.requests == []
    waiting = author.get(asked["Location"]).content.decode()
    assert "Asking the model to rank these…" in waiting
    assert 'hx-trigger="every 1s"' in waiting
    assert "Ask the model to rank these</button>" not in waiting

    for callback in queued:
        callback()
    answered = author.get(asked["Location"], headers={"HX-Request": "true"}).content.decode()

    assert answered.startswith('\n<div id="heal-proposal">')
    assert "Proposed by the model fake-ranker" in answered
    assert "hx-trigger" not in answered
    # The fake answers the reverse of the order it was given.
    assert sorted(first, reverse=True) != first
    shown = [answered.index(f"“{name}”") for name in NAMES]
    assert sorted(range(3), key=lambda i: shown[i]) == sorted(range(3), key=lambda i: -first[i])
    [request] = model.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["model"] == "fake-ranker"
    prompt = "\n".join(m["content"] for m in request["messages"])
    # Canaries: what the run typed, its inputs, the credential's values.
    for secret in (TYPED, "portal-demo-2026", "acme-demo", "12.00", "INV-1001"):
        assert secret not in prompt
    assert "the button 'Review payment'" in prompt
    call.refresh_from_db()
    assert (call.status, call.model_name) == ("answered", "fake-ranker")
    assert call.answer.startswith('{"order": [')
    assert call.answered_at is not None
    asked_event = AuditEvent.objects.get(action="assist.model_asked")
    event = AuditEvent.objects.get(action="assist.model_called")
    assert asked_event.actor == event.actor == operator
    assert event.after is not None
    assert asked_event.after is not None
    assert event.after["prompt_chars"] == len(request["messages"][-1]["content"])
    assert asked_event.after["prompt_chars"] == event.after["prompt_chars"]
    assert event.after["answer"] == call.answer
    assert event.after["purpose"] == "rank healing candidates"
    # A proposal only: no draft was made, nothing changed.
    assert not demo_workflow.versions.filter(status="draft").exists()


def test_a_failing_model_leaves_the_order_and_says_so_in_place(
    operator: User,
    demo_workflow: Workflow,
    author: Client,
    model: FakeModel,
    run_files_in_tmp: Path,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    url = a_failed_review(operator, demo_workflow)
    model.failing = True
    before = author.get(url).content.decode()

    page = author.get(ask(author, url, django_capture_on_commit_callbacks, action="rank"))

    body = page.content.decode()
    assert page.status_code == 200
    assert "Nothing was proposed: the model at" in body
    assert "hx-trigger" not in body
    # Asked again from the same place.
    assert "Ask the model to rank these</button>" in body
    assert sorted(NAMES, key=body.index) == sorted(NAMES, key=before.index)
    call = ModelCall.objects.get()
    assert call.status == "failed"
    assert "overloaded" in call.error
    event = AuditEvent.objects.get(action="assist.model_called")
    assert event.after is not None
    assert "overloaded" in event.after["error"]


def test_assistance_is_off_by_default(
    operator: User, demo_workflow: Workflow, author: Client, run_files_in_tmp: Path
) -> None:
    url = a_failed_review(operator, demo_workflow)

    assert "Ask the model" not in author.get(url).content.decode()
    page = author.post(url, {"field": "target", "action": "rank"})
    assert page.status_code == 400
    assert "no model is configured (PANDAWEB_ASSIST_URL)" in page.content.decode()
    assert not ModelCall.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="assist.").exists()


def test_a_description_is_matched_to_an_element_of_the_page_only(
    operator: User,
    demo_workflow: Workflow,
    author: Client,
    model: FakeModel,
    run_files_in_tmp: Path,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    url = a_failed_review(operator, demo_workflow)

    page = author.get(
        ask(
            author,
            url,
            django_capture_on_commit_callbacks,
            action="describe",
            description="payment review",
        )
    ).content.decode()

    first = page.index('<li class="card">')
    assert page.index("[3] button “Payment review”", first) < page.index("“Check the payment”")
    assert "the model&#x27;s choice for &#x27;payment review&#x27;" in page
    assert 'value="payment review"' in page
    [request] = model.requests
    prompt = request["messages"][-1]["content"]
    assert '[9] textbox "IBAN"' in prompt
    assert TYPED not in prompt
    call = ModelCall.objects.get()
    assert (call.purpose, call.description) == ("choose", "payment review")
    assert 9 in call.offered
    event = AuditEvent.objects.get(action="assist.model_called")
    assert event.after is not None
    assert event.after["purpose"] == "choose an element"

    made_up = author.get(
        ask(
            author,
            url,
            django_capture_on_commit_callbacks,
            action="describe",
            description="the pink elephant",
        )
    ).content.decode()
    assert "Nothing was proposed: the model named no element of the page for &#x27;the pink" in (
        made_up
    )


def test_an_empty_description_asks_nothing(
    operator: User,
    demo_workflow: Workflow,
    author: Client,
    model: FakeModel,
    run_files_in_tmp: Path,
) -> None:
    url = a_failed_review(operator, demo_workflow)

    page = author.post(url, {"field": "target", "action": "describe", "description": "  "})

    assert page.status_code == 400
    assert "Nothing was proposed: describe the element first." in page.content.decode()
    assert not ModelCall.objects.exists()


def test_the_model_s_pick_is_used_and_pictured_even_when_no_rule_proposed_it(
    operator: User,
    demo_workflow: Workflow,
    author: Client,
    model: FakeModel,
    run_files_in_tmp: Path,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    run = failed_at(operator, demo_workflow, REVIEW, "review", ["Back", "Continue"])
    url = f"/runs/{run.pk}/steps/{REVIEW}/heal/"
    assert "“Continue”" not in author.get(url).content.decode()

    answered = ask(
        author, url, django_capture_on_commit_callbacks, action="describe", description="continue"
    )

    assert "[2] button “Continue”" in author.get(answered).content.decode()
    assert author.get(f"{url}2.png")["Content-Type"] == "image/png"
    # The person's pick, from the page that shows the model's answer.
    author.post(answered, {"field": "target", "number": 2})
    draft = demo_workflow.versions.get(status="draft")
    assert next(s for s in draft.steps if s["id"] == "review")["target"]["name"] == "Continue"


def test_a_run_input_echoed_by_the_page_reaches_the_model_as_its_reference(
    operator: User,
    demo_workflow: Workflow,
    author: Client,
    model: FakeModel,
    run_files_in_tmp: Path,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    run = failed_at(operator, demo_workflow, REVIEW, "review", ["Pay INV-1001", "Review INV-1001"])

    ask(
        author,
        f"/runs/{run.pk}/steps/{REVIEW}/heal/",
        django_capture_on_commit_callbacks,
        action="describe",
        description="the review button",
    )

    prompt = model.requests[0]["messages"][-1]["content"]
    assert "INV-1001" not in prompt
    assert '[2] button "Review {{ params.invoice }}"' in prompt


def test_a_question_and_its_answer_are_the_asker_s_only(
    operator: User,
    demo_workflow: Workflow,
    author: Client,
    model: FakeModel,
    run_files_in_tmp: Path,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    url = a_failed_review(operator, demo_workflow)
    answered = ask(author, url, django_capture_on_commit_callbacks, action="rank")
    colleague, stranger = Client(), Client()
    colleague.force_login(user_with_role(Role.OPERATORS, username="colin"))
    stranger.force_login(user_with_role(Role.REVIEWERS, username="sasha"))

    assert author.get(answered).status_code == 200
    assert colleague.get(answered).status_code == 404
    assert stranger.get(answered).status_code == 403
    # Nor is the call read on another run's page.
    other = a_failed_review(operator, demo_workflow)
    assert author.get(answered.replace(url, other)).status_code == 404


def test_a_second_delivery_of_the_task_asks_nothing_and_a_gone_call_is_let_go(
    operator: User,
    demo_workflow: Workflow,
    author: Client,
    model: FakeModel,
    run_files_in_tmp: Path,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    url = a_failed_review(operator, demo_workflow)
    ask(author, url, django_capture_on_commit_callbacks, action="rank")
    call = ModelCall.objects.get()

    model_call_task.apply(kwargs={"call_id": call.pk}, throw=True)
    model_call_task.apply(kwargs={"call_id": call.pk + 1}, throw=True)

    assert len(model.requests) == 1
    assert AuditEvent.objects.filter(action="assist.model_called").count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_model_is_asked_by_a_worker_thread_after_the_request_commits(
    operator: User,
    demo_workflow: Workflow,
    model: FakeModel,
    run_files_in_tmp: Path,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The embedded default: the real dispatcher, a pool of this test's own (earlier tests' runs
    # may still occupy the process's), no test transaction around the request.
    settings.RUN_EXECUTION = "thread"
    monkeypatch.setattr(dispatcher, "_pool", None)
    monkeypatch.setattr(assist_services, "dispatch", REAL_DISPATCH)
    client = Client()
    client.force_login(operator)
    url = a_failed_review(operator, demo_workflow)

    asked = client.post(url, {"field": "target", "action": "rank"})

    assert asked.status_code == 302
    deadline = time.monotonic() + 30
    while ModelCall.objects.filter(status="pending").exists():
        assert time.monotonic() < deadline, "no worker answered the model call"
        time.sleep(0.05)
    assert "Proposed by the model fake-ranker" in client.get(asked["Location"]).content.decode()
    assert AuditEvent.objects.filter(action="assist.model_called").count() == 1
