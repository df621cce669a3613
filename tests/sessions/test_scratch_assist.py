"""A model's help in a scratch session: finding a described element and drafting steps on the
page as last seen, asked by a worker, against a fake of an OpenAI-compatible endpoint on
loopback (no real model can run here: tests/sessions/fake_model.py). What it proposes joins
the draft only when the person adds it, and its prompt holds no value typed and no secret."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
import yaml
from celery import Task
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone
from pytest_django.fixtures import Settings

from pandaweb.assist import services as assist_services
from pandaweb.assist.models import ModelCall
from pandaweb.audit.models import AuditEvent
from sessions import scratch_assist
from sessions.engine.vocabulary import MASK
from sessions.models import ScratchSession
from sessions.services import scratch
from tests.patching import patch_dispatch
from tests.sessions.fake_model import FakeModel, fake_model_server
from workflows import services as workflow_services
from workflows.models import Credential, Workflow

Capture = Callable[..., AbstractContextManager[list[Callable[[], None]]]]
# A parameter's default that the page echoes: the model reads the reference, not the value.
ECHOED = "INV-7731-canary"
PAGE = [
    {"number": 1, "role": "heading", "name": "Sign in", "interactive": False},
    {"number": 2, "role": "textbox", "name": "Username", "interactive": True, "value": "typed"},
    {"number": 3, "role": "textbox", "name": "Password", "interactive": True, "value": MASK},
    {"number": 4, "role": "button", "name": "Sign in", "interactive": True},
    {"number": 5, "role": "link", "name": f"Invoice {ECHOED}", "interactive": True},
]


@pytest.fixture
def model(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModel]:
    def in_process(task: Task, **kwargs: Any) -> None:
        transaction.on_commit(lambda: task.apply(kwargs=kwargs, throw=True))

    monkeypatch.setattr(assist_services, "dispatch", in_process)
    with fake_model_server() as (fake, url):
        settings.ASSIST_URL = url
        settings.ASSIST_MODEL = "fake-drafter"
        yield fake


@pytest.fixture
def session(operator: User, acme_credential: Credential, monkeypatch: Any) -> ScratchSession:
    patch_dispatch(monkeypatch, lambda task, **kwargs: None)
    text = yaml.safe_dump(
        {
            "pandaweb": 1,
            "name": "Drafted",
            "slug": "drafted",
            "settings": {"allowed_hosts": ["127.0.0.1:8001"], "credentials": ["acme-portal"]},
            "parameters": [{"name": "invoice", "type": "string", "default": ECHOED}],
            "steps": [{"id": "open-login", "type": "goto", "url": "http://127.0.0.1:8001/login"}],
        }
    )
    workflow: Workflow = workflow_services.workflow_import(user=operator, text=text)
    opened = scratch.scratch_open(workflow_id=workflow.pk, user=operator)
    ScratchSession.objects.filter(pk=opened.pk).update(
        status=ScratchSession.Status.READY,
        picture="3-1.jpg",
        observation={"elements": PAGE, "width": 1280, "height": 900, "upcoming": 1},
    )
    opened.refresh_from_db()
    return opened


@pytest.mark.django_db
def test_a_described_element_is_found_on_the_page_and_only_proposed(
    operator: User,
    session: ScratchSession,
    model: FakeModel,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        call = scratch_assist.scratch_assist_ask(
            scratch_id=session.pk, user=operator, purpose=ModelCall.Purpose.CHOOSE, words="Sign in"
        )
    call.refresh_from_db()

    assert call.status == "answered"
    chosen = scratch_assist.scratch_assist_chosen(session, call)
    assert chosen is not None
    assert (chosen["number"], chosen["role"]) == (4, "button")
    # Read against the page it was asked about only.
    session.picture = "4-1.jpg"
    assert scratch_assist.scratch_assist_chosen(session, call) is None
    asked = AuditEvent.objects.get(action="assist.model_called")
    assert (asked.object_type, asked.object_id) == ("scratch_session", str(session.pk))


@pytest.mark.django_db
def test_drafted_steps_join_the_draft_when_added_and_the_prompt_holds_no_value(
    operator: User,
    session: ScratchSession,
    acme_credential: Credential,
    model: FakeModel,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    goal = "fill the username and the password, then press sign in"
    with django_capture_on_commit_callbacks(execute=True):
        call = scratch_assist.scratch_assist_ask(
            scratch_id=session.pk, user=operator, purpose=ModelCall.Purpose.DRAFT, words=goal
        )
    call.refresh_from_db()

    drafted = scratch_assist.scratch_assist_drafted(session, call)
    assert [entry["step"] for entry in drafted] == [
        {"id": "fill-username", "type": "fill", "value": "{{ secrets.acme-portal.username }}",
         "target": {"role": "textbox", "name": "Username", "exact": True}},
        {"id": "fill-password", "type": "fill", "value": "{{ secrets.acme-portal.password }}",
         "target": {"role": "textbox", "name": "Password", "exact": True}},
        {"id": "click-sign-in", "type": "click",
         "target": {"role": "button", "name": "Sign in", "exact": True}},
    ]  # fmt: skip
    draft = session.workflow.versions.get(status="draft")
    assert [s["id"] for s in draft.steps] == ["open-login"]

    added = scratch_assist.scratch_assist_add(
        scratch_id=session.pk, user=operator, call_id=call.pk, after="open-login"
    )

    assert added == ["fill-username", "fill-password", "click-sign-in"]
    draft.refresh_from_db()
    assert [s["id"] for s in draft.steps] == ["open-login", *added]
    note = AuditEvent.objects.filter(action="workflow.step_added").last()
    assert note is not None
    assert "drafted by the model fake-drafter" in str(note.extra)
    with pytest.raises(scratch.ScratchError, match="in the draft already"):
        scratch_assist.scratch_assist_add(
            scratch_id=session.pk, user=operator, call_id=call.pk, after="open-login"
        )
    prompt = model.requests[-1]["messages"][-1]["content"]
    assert ECHOED not in prompt
    assert "{{ params.invoice }}" in prompt
    for value in ("typed", "acme-demo", "portal-demo-2026"):
        assert value not in prompt


@pytest.mark.django_db
def test_a_masked_field_is_never_drafted_with_words_of_the_models(
    operator: User, session: ScratchSession
) -> None:
    answer = '{"steps": [{"do": "fill", "element": 3, "value": {"text": "hunter2"}}]}'
    call = ModelCall.objects.create(
        requested_by=operator, scratch=session, target_field=session.picture,
        purpose=ModelCall.Purpose.DRAFT, prompt="Goal: log in", offered=[2, 3, 4, 5],
        status=ModelCall.Status.ANSWERED, answer=answer, answered_at=timezone.now(),
    )  # fmt: skip

    assert scratch_assist.scratch_assist_drafted(session, call) == []
