"""Answering a run's question through the HTTP API: the same service, the same refusals, and a
one-time code that never comes back."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User

from pandaweb.core.roles import Role
from sessions.models import Run
from tests.api.conftest import Api, make_token
from tests.approvals.test_questions import asking
from tests.factories import user_with_role
from workflows.models import Workflow

pytestmark = pytest.mark.django_db


def problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    return dict(json.loads(response.content))


def test_the_launcher_answers_once_and_the_code_never_comes_back(
    operator: User, demo_workflow: Workflow
) -> None:
    question = asking(operator, demo_workflow)
    api = Api(make_token(operator))
    path = f"/runs/{question.run_id}/questions/{question.pk}/answer"

    waiting = api.get(f"/runs/{question.run_id}").json()
    assert waiting["status"] == "awaiting_answer"
    [shown] = waiting["questions"]
    assert shown["kind"] == "code"
    assert shown["answer"] is None
    assert shown["links"]["answer"] == f"/api/v1{path}"

    answered = api.post(path, {"answer": "482 913"})
    assert answered.status_code == 200, answered.content
    body = answered.json()
    assert (body["id"], body["run"], body["run_status"]) == (
        question.pk,
        question.run_id,
        "running",
    )
    assert body["answer"] == "••••"
    assert body["answerer"] == "olivia"
    assert "482913" not in answered.content.decode()
    assert api.get(f"/runs/{question.run_id}").json()["questions"][0]["answer"] == "••••"

    again = problem(api.post(path, {"answer": "482913"}), 409)
    assert again["type"].endswith("answer-refused")
    assert again["detail"] == "this question was already answered by olivia"


def test_someone_else_or_a_bad_code_is_refused_and_nothing_changes(
    operator: User, demo_workflow: Workflow
) -> None:
    question = asking(operator, demo_workflow)
    path = f"/runs/{question.run_id}/questions/{question.pk}/answer"
    colleague = Api(make_token(user_with_role(Role.OPERATORS, username="otto")))
    mine = Api(make_token(operator))

    refused = problem(colleague.post(path, {"answer": "482913"}), 409)
    assert refused["detail"] == "only the person who launched the run may answer this question"
    bad = problem(mine.post(path, {"answer": "48-29!"}), 422)
    assert bad["errors"] == [{"field": "answer", "message": "a code is 3 to 12 letters or digits"}]
    problem(
        mine.post(f"/runs/{question.run_id}/questions/{question.pk + 1}/answer", {"answer": "1"}),
        404,
    )
    reader = Api(make_token(operator, ["runs:read"]))
    problem(reader.post(path, {"answer": "482913"}), 403)

    assert Run.objects.get(pk=question.run_id).status == Run.Status.AWAITING_ANSWER


def test_a_token_that_only_answers_lists_and_answers_its_questions_and_reads_nothing_else(
    operator: User, demo_workflow: Workflow
) -> None:
    question = asking(operator, demo_workflow)
    answering = Api(make_token(operator, ["questions:answer"]))

    [waiting] = answering.get("/questions/").json()
    assert waiting["id"] == question.pk
    assert (waiting["run"], waiting["run_status"]) == (question.run_id, "awaiting_answer")
    assert waiting["question"] == "Type the code the portal sent by SMS"
    assert waiting["launched_by"] == "olivia"
    assert waiting["workflow"] == demo_workflow.slug
    assert "inputs" not in waiting
    assert "steps" not in waiting

    answered = answering.post(
        waiting["links"]["answer"].removeprefix("/api/v1"), {"answer": "482913"}
    )
    assert answered.status_code == 200, answered.content
    assert answered.json()["run_status"] == "running"
    assert "482913" not in answered.content.decode()
    question.refresh_from_db()
    assert question.status == "answered"
    assert question.answerer == operator
    assert answering.get("/questions/").json() == []
    # The scope answers; reading the run is runs:read's.
    assert problem(answering.get(f"/runs/{question.run_id}"), 403)["type"].endswith("missing-scope")


def test_a_launching_token_may_not_answer_and_its_refusal_says_nothing_about_the_question(
    operator: User, demo_workflow: Workflow
) -> None:
    question = asking(operator, demo_workflow)
    launching = Api(make_token(operator, ["runs:launch", "runs:read"]))

    refused = problem(
        launching.post(
            f"/runs/{question.run_id}/questions/{question.pk}/answer", {"answer": "482913"}
        ),
        403,
    )
    missing = problem(launching.post("/runs/999999/questions/999999/answer", {"answer": "1"}), 403)
    listed = problem(launching.get("/questions/"), 403)

    assert refused["type"].endswith("missing-scope")
    assert refused["detail"] == "this token lacks the scope 'questions:answer'"
    # The same answer for a question that exists and one that does not.
    assert {k: v for k, v in refused.items() if k != "instance"} == {
        k: v for k, v in missing.items() if k != "instance"
    }
    assert "482913" not in json.dumps(refused)
    assert "SMS" not in json.dumps(refused)
    assert listed["type"].endswith("missing-scope")
    question.refresh_from_db()
    assert question.status == "pending"
    assert Run.objects.get(pk=question.run_id).status == Run.Status.AWAITING_ANSWER


def test_the_scope_is_bounded_by_the_owners_role(operator: User, demo_workflow: Workflow) -> None:
    from pandaweb.api.services import TokenError

    question = asking(operator, demo_workflow)
    with pytest.raises(TokenError) as beyond:
        make_token(user_with_role(None, username="sam"), ["questions:answer"])
    assert "questions:answer" in beyond.value.field_errors["scopes"][0]
    answering = Api(make_token(operator, ["questions:answer"]))
    operator.groups.clear()

    refused = problem(
        answering.post(
            f"/runs/{question.run_id}/questions/{question.pk}/answer", {"answer": "482913"}
        ),
        403,
    )
    assert refused["type"].endswith("scope-beyond-role")
    assert Run.objects.get(pk=question.run_id).status == Run.Status.AWAITING_ANSWER
