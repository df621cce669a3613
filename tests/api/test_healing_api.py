"""Healing a failed step over the API: the healing page's proposal, pictures, model questions and
pick, with its rules (authors of the run's team; the draft, never a running version; an
irreversible step only with its id typed)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Task
from django.contrib.auth.models import User
from django.db import transaction
from PIL import Image
from pytest_django.fixtures import Settings

from pandaweb.assist import services as assist_services
from pandaweb.assist.models import ModelCall
from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from tests.api.conftest import Api, make_token
from tests.api.test_api import problem
from tests.factories import user_with_role
from tests.patching import patch_dispatch
from tests.sessions.fake_model import FakeModel, fake_model_server
from tests.sessions.healing import REVIEW, SUBMIT, failed_at
from workflows.models import Workflow, WorkflowVersion

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("run_files_in_tmp")]

NAMES = ["Back", "Check the payment"]


@pytest.fixture(autouse=True)
def runs_stay_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    """These runs are put in their failed state by hand: nothing executes them."""
    patch_dispatch(monkeypatch, lambda task, **kwargs: None)


def healing(run_id: int, index: int = REVIEW) -> str:
    return f"/runs/{run_id}/steps/{index}/healing"


def draft_step(workflow: Workflow, step_id: str) -> dict[str, Any]:
    draft = workflow.versions.get(status=WorkflowVersion.Status.DRAFT)
    return next(s for s in draft.steps if s["id"] == step_id)


def test_the_proposal_names_the_candidates_and_the_pick_goes_into_the_draft(
    operator: User, demo_workflow: Workflow
) -> None:
    run = failed_at(operator, demo_workflow, REVIEW, "review", NAMES)
    api = Api(make_token(operator))

    proposal = json.loads(api.get(healing(run.pk)).content)
    best = proposal["candidates"][0]
    picture = api.get(best["picture"].removeprefix("/api/v1"))
    answer = api.post(healing(run.pk), {"field": "target", "number": best["number"]})

    assert (proposal["step_id"], proposal["field"], proposal["confirm"]) == (
        "review",
        "target",
        None,
    )
    assert proposal["looked_for"] == "the button 'Review payment'"
    assert (best["name"], best["target"], best["matches"]) == (
        "Check the payment",
        "button 'Check the payment' exact",
        1,
    )
    assert any("payment" in reason for reason in best["reasons"])
    assert picture["Content-Type"] == "image/png"
    assert Image.open(io.BytesIO(picture.content)).getpixel((80, 98)) != (255, 255, 255)
    assert answer.status_code == 200, answer.content
    body = json.loads(answer.content)
    review = next(s for s in body["document"]["steps"] if s["id"] == "review")
    assert review["target"] == {"role": "button", "name": "Check the payment", "exact": True}
    # The run's version is untouched: runs use the change once the draft is published.
    run.version.refresh_from_db()
    assert run.version.steps[REVIEW]["target"] == {"role": "button", "name": "Review payment"}
    event = AuditEvent.objects.get(action="workflow.step_healed")
    assert event.actor == operator
    assert "via" in event.extra  # the token the change came through


def test_an_irreversible_step_changes_only_with_its_id_typed(
    operator: User, demo_workflow: Workflow
) -> None:
    run = failed_at(operator, demo_workflow, SUBMIT, "submit-payment", ["Submit the payment"])
    api = Api(make_token(operator))

    proposal = json.loads(api.get(healing(run.pk, SUBMIT)).content)
    refused = problem(api.post(healing(run.pk, SUBMIT), {"number": 1, "confirm": "yes"}), 422)
    assert not demo_workflow.versions.filter(status=WorkflowVersion.Status.DRAFT).exists()
    done = api.post(healing(run.pk, SUBMIT), {"number": 1, "confirm": "submit-payment"})

    assert proposal["confirm"] == "submit-payment"
    assert refused["errors"][0]["field"] == "confirm"
    assert "type its id to confirm" in refused["errors"][0]["message"]
    assert done.status_code == 200, done.content
    assert draft_step(demo_workflow, "submit-payment")["target"]["name"] == "Submit the payment"


def test_a_written_target_is_read_and_a_wrong_one_is_refused_in_words(
    operator: User, demo_workflow: Workflow
) -> None:
    run = failed_at(operator, demo_workflow, REVIEW, "review", ["Help"], role="link")
    api = Api(make_token(operator))

    neither = problem(api.post(healing(run.pk), {}), 422)
    unreadable = problem(api.post(healing(run.pk), {"target": 'button "unclosed'}), 422)
    written = api.post(healing(run.pk), {"target": 'button "Review the payment"'})

    assert neither["errors"][0]["field"] == "number"
    assert unreadable["errors"][0]["field"] == "target"
    assert "cannot read the target" in unreadable["errors"][0]["message"]
    assert written.status_code == 200, written.content
    assert draft_step(demo_workflow, "review")["target"] == {
        "role": "button",
        "name": "Review the payment",
    }


def test_a_step_that_passed_offers_nothing_and_says_why(
    operator: User, demo_workflow: Workflow
) -> None:
    run = failed_at(operator, demo_workflow, REVIEW, "review", NAMES)
    run.step_results.update(status="succeeded")

    refused = problem(Api(make_token(operator)).get(healing(run.pk)), 409)

    assert refused["detail"] == "this step cannot be healed: only a failed step is healed"


def test_it_needs_both_scopes_and_authoring_rights(operator: User, demo_workflow: Workflow) -> None:
    run = failed_at(operator, demo_workflow, REVIEW, "review", NAMES)
    reviewer = user_with_role(Role.REVIEWERS, username="rita")

    reading = problem(Api(make_token(operator, ["runs:read"])).get(healing(run.pk)), 403)
    writing = problem(Api(make_token(operator, ["workflows:write"])).get(healing(run.pk)), 403)
    watcher = problem(Api(make_token(reviewer)).get(healing(run.pk)), 403)
    missing = problem(Api(make_token(operator)).get(healing(run.pk, 99)), 404)

    assert "workflows:write" in reading["detail"]
    assert "runs:read" in writing["detail"]
    assert watcher["type"].endswith("missing-scope")
    assert missing["detail"] == "no such object, or not yours to see"


def test_without_a_model_nothing_is_asked(operator: User, demo_workflow: Workflow) -> None:
    run = failed_at(operator, demo_workflow, REVIEW, "review", NAMES)

    refused = problem(Api(make_token(operator)).post(f"{healing(run.pk)}/model", {}), 409)

    assert refused["type"].endswith("model-unavailable")
    assert not ModelCall.objects.exists()


@pytest.fixture
def model(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModel]:
    """A configured model (a fake on loopback: no model API is reachable here), asked by its
    task in this process once the request commits."""

    def in_process(task: Task, **kwargs: Any) -> None:
        transaction.on_commit(lambda: task.apply(kwargs=kwargs, throw=True))

    monkeypatch.setattr(assist_services, "dispatch", in_process)
    with fake_model_server() as (fake, url):
        settings.ASSIST_URL = url
        settings.ASSIST_MODEL = "fake-ranker"
        yield fake


def test_the_model_ranks_the_candidates_and_the_answer_is_polled(
    operator: User,
    demo_workflow: Workflow,
    model: FakeModel,
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    names = ["Check the payment", "Review payment later", "Payment review"]
    run = failed_at(operator, demo_workflow, REVIEW, "review", names)
    api = Api(make_token(operator))
    before = [c["number"] for c in json.loads(api.get(healing(run.pk)).content)["candidates"]]

    with django_capture_on_commit_callbacks(execute=True):
        asked = api.post(f"{healing(run.pk)}/model", {"field": "target"})
    call = json.loads(asked.content)["model_call"]
    answered = json.loads(api.get(healing(run.pk), {"call": call["id"]}).content)

    assert asked.status_code == 202, asked.content
    assert (call["purpose"], call["status"]) == ("rank", "pending")
    assert answered["model_call"]["status"] == "answered"
    # The fake model orders the candidates it was offered in reverse.
    assert [c["number"] for c in answered["candidates"]] == before[::-1]


def test_another_persons_model_call_is_not_found(
    operator: User, demo_workflow: Workflow, model: FakeModel
) -> None:
    run = failed_at(operator, demo_workflow, REVIEW, "review", NAMES)
    asked = json.loads(Api(make_token(operator)).post(f"{healing(run.pk)}/model", {}).content)
    colleague = user_with_role(Role.OPERATORS, username="olga")

    found = Api(make_token(colleague)).get(healing(run.pk), {"call": asked["model_call"]["id"]})

    problem(found, 404)


def test_pictures_are_gone_with_the_runs_files(
    operator: User, demo_workflow: Workflow, run_files_in_tmp: Path
) -> None:
    run = failed_at(operator, demo_workflow, REVIEW, "review", NAMES)
    (run_files_in_tmp / str(run.pk) / "steps" / "shot.jpg").unlink()

    problem(Api(make_token(operator)).get(f"{healing(run.pk)}/elements/2.png"), 404)
