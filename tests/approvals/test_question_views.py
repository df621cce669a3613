"""The question on the run page: a form for who may answer, the reason for the others, and the
refusals of the service shown in words."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from approvals.models import Question
from pandaweb.core.roles import Role
from tests.approvals.test_questions import asking
from tests.factories import user_with_role
from workflows.models import Workflow

pytestmark = pytest.mark.django_db


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_launcher_sees_a_masked_code_field_and_answers_from_the_run_page(
    operator: User, demo_workflow: Workflow, continuations: list[dict[str, Any]]
) -> None:
    question = asking(operator, demo_workflow)
    client = signed_in(operator)

    page = client.get(f"/runs/{question.run_id}/").content.decode()
    assert 'id="question"' in page
    assert "Type the code the portal sent by SMS" in page
    assert 'type="password" inputmode="numeric" autocomplete="one-time-code"' in page

    answered = client.post(
        f"/approvals/questions/{question.pk}/answer/", {"answer": "482913"}, follow=True
    )
    assert "Answer sent: the run goes on." in answered.content.decode()
    question.refresh_from_db()
    assert question.status == Question.Status.ANSWERED

    again = client.post(
        f"/approvals/questions/{question.pk}/answer/", {"answer": "482913"}, follow=True
    )
    assert (
        "Your answer was not taken: this question was already answered by olivia."
        in again.content.decode()
    )
    assert len(continuations) == 1


def test_a_colleague_sees_who_may_answer_and_cannot_answer(
    operator: User, demo_workflow: Workflow, continuations: list[dict[str, Any]]
) -> None:
    question = asking(operator, demo_workflow)
    colleague = signed_in(user_with_role(Role.OPERATORS, username="otto"))

    page = colleague.get(f"/runs/{question.run_id}/").content.decode()
    assert "Only the person who launched the run may answer this question." in page
    assert 'name="answer"' not in page
    refused = colleague.post(
        f"/approvals/questions/{question.pk}/answer/", {"answer": "482913"}, follow=True
    )
    assert "only the person who launched the run may answer" in refused.content.decode()
    question.refresh_from_db()
    assert question.status == Question.Status.PENDING
    assert continuations == []


def test_a_choice_is_offered_as_its_options(
    operator: User, demo_workflow: Workflow, continuations: list[dict[str, Any]]
) -> None:
    question = asking(operator, demo_workflow, kind="choice", options=["Nordwind GmbH", "Baltic"])

    page = signed_in(operator).get(f"/runs/{question.run_id}/").content.decode()

    assert 'type="radio" name="answer" value="Nordwind GmbH"' in page
    assert 'type="radio" name="answer" value="Baltic"' in page


def test_someone_without_access_to_runs_cannot_answer(
    operator: User, demo_workflow: Workflow, continuations: list[dict[str, Any]]
) -> None:
    question = asking(operator, demo_workflow)
    nobody = signed_in(user_with_role(None, username="sam"))

    response = nobody.post(f"/approvals/questions/{question.pk}/answer/", {"answer": "482913"})

    assert response.status_code == 403
    question.refresh_from_db()
    assert question.status == Question.Status.PENDING


def test_the_badge_and_the_home_page_count_the_questions_waiting_for_me(
    operator: User, demo_workflow: Workflow
) -> None:
    import re

    question = asking(operator, demo_workflow)
    reviewer = user_with_role(Role.REVIEWERS, username="rory")

    mine = signed_in(operator).get("/").content.decode()
    theirs = signed_in(reviewer).get("/").content.decode()
    nobody = signed_in(user_with_role(None, username="sam")).get("/").content.decode()

    # The operator has no approvals queue: the badge sits on Runs and counts the question.
    [badge] = re.findall(r'<a href="/runs/"[^>]*>Runs (<span id="needs-badge".*?</span>)', mine)
    assert 'data-questions="1"' in badge
    assert ">1</span>" in badge
    assert "<strong>1</strong> asking you" in mine
    assert f'href="/runs/{question.run_id}/#question"' in mine
    # The reviewer's badge is on Approvals, and nothing is asked of them.
    assert re.search(r'Approvals <span id="needs-badge"[^>]*data-questions="0"', theirs)
    assert "<strong>0</strong> asking you" in theirs
    assert "needs-badge" not in nobody
