"""Healing from a failed step's page: candidates from what the step saw, a person's pick into the
draft (never into a running version), an extra confirmation for an irreversible step."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from PIL import Image

from pandaweb.assist.models import ModelCall
from pandaweb.audit.models import AuditEvent
from pandaweb.core.models import Membership, Team
from pandaweb.core.roles import Role
from sessions.models import Run, StepResult
from tests.factories import member_of, user_with_role
from tests.sessions.healing import REVIEW, SUBMIT, failed_at
from workflows.models import Workflow, WorkflowVersion

pytestmark = pytest.mark.usefixtures("runs_stay_queued")


def draft_step(workflow: Workflow, step_id: str) -> dict[str, Any]:
    draft = workflow.versions.get(status=WorkflowVersion.Status.DRAFT)
    return next(s for s in draft.steps if s["id"] == step_id)


def test_a_renamed_button_is_picked_on_the_failed_step_s_page_and_goes_into_a_draft(
    operator: User, demo_workflow: Workflow, author: Client, run_files_in_tmp: Path
) -> None:
    run = failed_at(operator, demo_workflow, REVIEW, "review", ["Back", "Check the payment"])

    page = author.get(f"/runs/{run.pk}/steps/{REVIEW}/")
    assert f'href="/runs/{run.pk}/steps/{REVIEW}/heal/"' in page.content.decode()
    page = author.get(f"/runs/{run.pk}/steps/{REVIEW}/heal/")
    body = page.content.decode()
    assert "the button &#x27;Review payment&#x27;" in body
    assert "[2] button “Check the payment”" in body
    assert "its name shares &#x27;payment&#x27;" in body
    picture = author.get(f"/runs/{run.pk}/steps/{REVIEW}/heal/2.png")
    assert picture["Content-Type"] == "image/png"
    assert Image.open(io.BytesIO(picture.content)).getpixel((80, 98)) != (255, 255, 255)

    answer = author.post(f"/runs/{run.pk}/steps/{REVIEW}/heal/", {"field": "target", "number": 2})

    assert answer.status_code == 302
    assert draft_step(demo_workflow, "review")["target"] == {
        "role": "button",
        "name": "Check the payment",
        "exact": True,
    }
    # The run's own version, and every published one, are untouched.
    run.version.refresh_from_db()
    assert run.version.steps[REVIEW]["target"] == {"role": "button", "name": "Review payment"}
    draft = demo_workflow.versions.get(status=WorkflowVersion.Status.DRAFT)
    assert f"after run #{run.pk} failed" in draft.message
    event = AuditEvent.objects.get(action="workflow.step_healed")
    assert event.before == {"target": {"role": "button", "name": "Review payment"}}
    assert event.actor == operator
    detail = author.get(f"/workflows/{demo_workflow.slug}/").content.decode()
    assert f'value="{draft.message}"'.replace("'", "&#x27;") in detail


def test_an_irreversible_step_is_healed_only_when_its_id_is_typed(
    operator: User, demo_workflow: Workflow, author: Client, run_files_in_tmp: Path
) -> None:
    run = failed_at(operator, demo_workflow, SUBMIT, "submit-payment", ["Submit the payment"])
    url = f"/runs/{run.pk}/steps/{SUBMIT}/heal/"

    assert "is irreversible" in author.get(url).content.decode()
    refused = author.post(url, {"field": "target", "number": 1, "confirm": "yes"})
    assert refused.status_code == 400
    assert "type its id to confirm" in refused.content.decode()
    assert not demo_workflow.versions.filter(status=WorkflowVersion.Status.DRAFT).exists()

    author.post(url, {"field": "target", "number": 1, "confirm": "submit-payment"})

    healed = draft_step(demo_workflow, "submit-payment")
    assert healed["target"]["name"] == "Submit the payment"
    assert healed["irreversible"] is True


def test_a_written_target_is_checked_and_a_wrong_one_changes_nothing(
    operator: User, demo_workflow: Workflow, author: Client, run_files_in_tmp: Path
) -> None:
    run = failed_at(operator, demo_workflow, REVIEW, "review", ["Back", "Help"], role="link")
    url = f"/runs/{run.pk}/steps/{REVIEW}/heal/"

    assert "Nothing on the page the step saw looks like" in author.get(url).content.decode()
    refused = author.post(url, {"field": "target", "target": 'button "unclosed'})
    assert refused.status_code == 400
    assert "cannot read the target" in refused.content.decode()

    author.post(url, {"field": "target", "target": 'button "Review the payment"'})
    assert draft_step(demo_workflow, "review")["target"] == {
        "role": "button",
        "name": "Review the payment",
    }


def test_people_who_cannot_author_cannot_heal_and_a_step_that_succeeded_offers_nothing(
    operator: User, demo_workflow: Workflow, run_files_in_tmp: Path
) -> None:
    run = failed_at(operator, demo_workflow, REVIEW, "review", ["Check the payment"])
    reviewer = Client()
    reviewer.force_login(user_with_role(Role.REVIEWERS, username="rita"))

    assert reviewer.get(f"/runs/{run.pk}/steps/{REVIEW}/heal/").status_code == 403
    page = reviewer.get(f"/runs/{run.pk}/steps/{REVIEW}/").content.decode()
    assert "/heal/" not in page
    StepResult.objects.filter(run=run).update(status=StepResult.Status.SUCCEEDED)
    author = Client()
    author.force_login(operator)
    answer = author.get(f"/runs/{run.pk}/steps/{REVIEW}/heal/", follow=True)
    assert "only a failed step is healed" in answer.content.decode()


def test_who_writes_workflows_in_another_team_only_cannot_heal_this_teams_runs(
    operator: User, demo_workflow: Workflow, run_files_in_tmp: Path
) -> None:
    run = failed_at(operator, demo_workflow, REVIEW, "review", ["Check the payment"])
    elsewhere = member_of(run.team, Role.REVIEWERS)
    Membership.objects.create(
        team=Team.objects.create(slug="procurement", name="Procurement"),
        user=elsewhere,
        role=Role.OPERATORS.value,
    )
    client = Client()
    client.force_login(elsewhere)
    heal = f"/runs/{run.pk}/steps/{REVIEW}/heal/"

    assert client.get(f"/runs/{run.pk}/steps/{REVIEW}/").status_code == 200
    page = client.get(heal, follow=True).content.decode()
    asked = client.post(heal, {"action": "describe", "description": "the check button"})

    assert f"you do not write {run.team}&#x27;s workflows" in page
    assert asked.status_code == 302
    assert not ModelCall.objects.exists()
    assert client.get(f"{heal}1.png").status_code == 404


def test_the_place_the_button_had_when_the_step_last_passed_proposes_a_new_name(
    operator: User, demo_workflow: Workflow, author: Client, run_files_in_tmp: Path
) -> None:
    passed = failed_at(operator, demo_workflow, REVIEW - 1, "fill-iban", ["Back", "Review payment"])
    Run.objects.filter(pk=passed.pk).update(status=Run.Status.SUCCEEDED)
    StepResult.objects.filter(run=passed).update(status=StepResult.Status.SUCCEEDED)
    StepResult.objects.create(
        run=passed, index=REVIEW, step_id="review", step_type="click", sentence="review",
        status=StepResult.Status.SUCCEEDED, started_at=timezone.now(), duration_ms=100,
    )  # fmt: skip
    run = failed_at(operator, demo_workflow, REVIEW, "review", ["Back", "Continue"])

    body = author.get(f"/runs/{run.pk}/steps/{REVIEW}/heal/").content.decode()

    assert "[2] button “Continue”" in body
    assert f"where the button was when run #{passed.pk} passed this step (2nd button)" in body
    assert "“Back”" not in body


def test_a_draft_changed_since_the_run_is_not_overwritten_and_notes_add_up(
    operator: User, demo_workflow: Workflow, author: Client, run_files_in_tmp: Path
) -> None:
    run = failed_at(operator, demo_workflow, REVIEW, "review", ["Check the payment"])
    url = f"/runs/{run.pk}/steps/{REVIEW}/heal/"
    author.post(url, {"field": "target", "number": 1})

    # The same failed run healed again: the draft now looks for the new button.
    again = author.post(url, {"field": "target", "number": 1})

    assert again.status_code == 400
    assert "looks for the button &#x27;Check the payment&#x27; now" in again.content.decode()
    other = failed_at(operator, demo_workflow, SUBMIT, "submit-payment", ["Submit the payment"])
    author.post(
        f"/runs/{other.pk}/steps/{SUBMIT}/heal/",
        {"field": "target", "number": 1, "confirm": "submit-payment"},
    )
    draft = demo_workflow.versions.get(status=WorkflowVersion.Status.DRAFT)
    assert draft.message.count("after run #") == 2
    assert AuditEvent.objects.filter(action="workflow.step_healed", run_id=other.pk).count() == 1


def test_a_run_whose_files_were_pruned_offers_no_pictures(
    operator: User, demo_workflow: Workflow, author: Client, run_files_in_tmp: Path
) -> None:
    run = failed_at(operator, demo_workflow, REVIEW, "review", ["Check the payment"])
    Run.objects.filter(pk=run.pk).update(files_pruned_at=timezone.now())

    page = author.get(f"/runs/{run.pk}/steps/{REVIEW}/heal/").content.decode()

    assert "“Check the payment”" in page
    assert "/heal/1.png" not in page
    assert author.get(f"/runs/{run.pk}/steps/{REVIEW}/heal/1.png").status_code == 404
