from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from sessions import rendering, services
from sessions.engine.last_frame import LAST_FRAME, last_frame_keep
from sessions.models import Artifact, Run, StepResult
from tests.factories import user_with_role
from workflows.models import Workflow

pytestmark = pytest.mark.django_db


def launched(user: User, workflow: Workflow) -> Run:
    return services.run_launch(
        workflow_id=workflow.pk, user=user, raw_inputs={"invoice": "INV-1001", "amount": "1250.00"}
    )


def test_the_launch_form_is_typed_and_a_double_submit_launches_once(
    operator: User, demo_workflow: Workflow
) -> None:
    client = Client()
    client.force_login(operator)

    page = client.get(f"/runs/launch/{demo_workflow.slug}/").content.decode()
    assert 'name="param_amount"' in page
    data = {"param_invoice": "INV-1001", "param_amount": "1250.00", "param_iban": "DE97",
            "idempotency_key": "form-key-1"}  # fmt: skip
    first = client.post(f"/runs/launch/{demo_workflow.slug}/", data)
    second = client.post(f"/runs/launch/{demo_workflow.slug}/", data)

    run = Run.objects.get()
    assert first["Location"] == second["Location"] == f"/runs/{run.pk}/"

    # Back, another amount, the same form: refused in the form's words, nothing launched.
    edited = client.post(f"/runs/launch/{demo_workflow.slug}/", {**data, "param_amount": "1.00"})
    assert edited.status_code == 200
    assert "This form already launched a run with other inputs." in edited.content.decode()
    assert Run.objects.count() == 1


def test_bad_inputs_come_back_with_field_errors(operator: User, demo_workflow: Workflow) -> None:
    client = Client()
    client.force_login(operator)

    response = client.post(
        f"/runs/launch/{demo_workflow.slug}/",
        {"param_invoice": "nope", "param_amount": "-1", "idempotency_key": "k"},
    )

    body = response.content.decode()
    assert response.status_code == 200
    assert "must match the pattern" in body
    assert "must be at least 0.01" in body
    assert not Run.objects.exists()


@pytest.mark.parametrize("role", [Role.REVIEWERS, Role.COMPLIANCE])
def test_readers_watch_runs_but_cannot_launch_or_cancel(
    role: Role, operator: User, demo_workflow: Workflow
) -> None:
    client = Client()
    client.force_login(operator)
    inputs = {"param_invoice": "INV-1001", "param_amount": "1.00", "idempotency_key": "x"}
    client.post(f"/runs/launch/{demo_workflow.slug}/", inputs)  # fmt: skip
    run = Run.objects.get()
    reader = Client()
    reader.force_login(user_with_role(role))

    assert reader.get("/runs/").status_code == 200
    assert reader.get(f"/runs/{run.pk}/").status_code == 200
    assert reader.get(f"/runs/launch/{demo_workflow.slug}/").status_code == 403
    assert reader.post(f"/runs/{run.pk}/cancel/").status_code == 403
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED


def test_run_files_cannot_escape_the_run_directory(operator: User, demo_workflow: Workflow) -> None:
    client = Client()
    client.force_login(operator)
    inputs = {"param_invoice": "INV-1001", "param_amount": "1.00", "idempotency_key": "y"}
    client.post(f"/runs/launch/{demo_workflow.slug}/", inputs)  # fmt: skip
    run = Run.objects.get()

    assert client.get(f"/runs/{run.pk}/files/../../secret_key").status_code == 404
    assert client.get(f"/runs/{run.pk}/files/steps/none.png").status_code == 404


def test_a_reviewer_reconciles_an_uncertain_action_from_the_run_page(
    operator: User, demo_workflow: Workflow
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from approvals.models import ApprovalRequest

    run = launched(operator, demo_workflow)
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.NEEDS_RECONCILIATION, failure_reason="the worker stopped"
    )
    ApprovalRequest.objects.create(
        run=run,
        step_index=13,
        step_id="submit-payment",
        status=ApprovalRequest.Status.APPROVED,
        intent_at=timezone.now(),
        expires_at=timezone.now() + timedelta(hours=1),
    )
    reviewer = Client()
    reviewer.force_login(user_with_role(Role.REVIEWERS, username="rory"))
    watcher = Client()
    watcher.force_login(operator)

    assert "Did the action happen?" in reviewer.get(f"/runs/{run.pk}/").content.decode()
    page = watcher.get(f"/runs/{run.pk}/").content.decode()
    assert "Did the action happen?" not in page
    assert "Cancel run" not in page
    assert watcher.post(f"/runs/{run.pk}/reconcile/", {"happened": "no"}).status_code == 403
    reviewer.post(f"/runs/{run.pk}/reconcile/", {"happened": "no", "note": ""})
    run.refresh_from_db()
    assert run.status == Run.Status.NEEDS_RECONCILIATION

    reviewer.post(
        f"/runs/{run.pk}/reconcile/", {"happened": "no", "note": "no receipt in the portal"}
    )

    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    assert run.failure_reason == "rory confirmed the action did not happen"


def test_it_refuses_reconciliation_by_the_person_who_launched_the_run(
    demo_workflow: Workflow,
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from approvals.models import ApprovalRequest

    launcher = user_with_role(Role.REVIEWERS, username="lena")
    launcher.groups.add(*user_with_role(Role.OPERATORS, username="oscar").groups.all())
    run = launched(launcher, demo_workflow)
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.NEEDS_RECONCILIATION, failure_reason="the worker stopped"
    )
    ApprovalRequest.objects.create(
        run=run,
        step_index=13,
        step_id="submit-payment",
        status=ApprovalRequest.Status.APPROVED,
        intent_at=timezone.now(),
        expires_at=timezone.now() + timedelta(hours=1),
    )
    client = Client()
    client.force_login(launcher)

    assert "Did the action happen?" not in client.get(f"/runs/{run.pk}/").content.decode()
    client.post(f"/runs/{run.pk}/reconcile/", {"happened": "no", "note": "no receipt"})

    run.refresh_from_db()
    assert run.status == Run.Status.NEEDS_RECONCILIATION
    assert not AuditEvent.objects.filter(run_id=run.pk, action="run.cancelled").exists()


def test_the_run_pages_forms_carry_a_csrf_token_for_plain_posts(
    operator: User, demo_workflow: Workflow
) -> None:
    run = launched(operator, demo_workflow)
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)

    page = client.get(f"/runs/{run.pk}/").content.decode()
    cancel_form = page.split('class="cancel-form">', 1)[1].split("</form>", 1)[0]
    token = cancel_form.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
    response = client.post(f"/runs/{run.pk}/cancel/", {"csrfmiddlewaretoken": token})

    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED


def test_a_finished_run_without_outputs_says_so(operator: User, demo_workflow: Workflow) -> None:
    running = launched(operator, demo_workflow)
    finished = launched(operator, demo_workflow)
    Run.objects.filter(pk=running.pk).update(status=Run.Status.RUNNING)
    Run.objects.filter(pk=finished.pk).update(status=Run.Status.SUCCEEDED)
    client = Client()
    client.force_login(operator)

    assert "none yet" in client.get(f"/runs/{running.pk}/").content.decode()
    page = client.get(f"/runs/{finished.pk}/").content.decode()
    assert '<p class="muted">No outputs</p>' in page
    assert "none yet" not in page


def test_a_run_s_files_show_their_whole_sha256(operator: User, demo_workflow: Workflow) -> None:
    run = launched(operator, demo_workflow)
    digest = "ab" * 32
    Artifact.objects.create(
        run=run, step_index=0, name="invoice_csv", filename="invoice.csv",
        path="files/invoice.csv", sha256=digest, size=120,
    )  # fmt: skip
    client = Client()
    client.force_login(operator)

    assert (
        f'<code class="hash-full">{digest}</code>'
        in client.get(f"/runs/{run.pk}/").content.decode()
    )


@pytest.mark.parametrize(
    ("status", "words", "why"),
    [
        (Run.Status.AWAITING_APPROVAL, "Waiting for approval — the browser is paused.",
         "this run is waiting for approval"),
        (Run.Status.AWAITING_ANSWER, "Waiting for an answer — the browser is paused.",
         "this run is waiting for an answer"),
        (Run.Status.QUEUED, "Queued — the browser starts when the run does.",
         "this run is queued"),
    ],
)  # fmt: skip
def test_a_run_whose_browser_is_not_working_says_so_and_why_control_cannot_be_taken(
    operator: User, demo_workflow: Workflow, status: str, words: str, why: str
) -> None:
    run = launched(operator, demo_workflow)
    Run.objects.filter(pk=run.pk).update(status=status)
    client = Client()
    client.force_login(operator)

    page = client.get(f"/runs/{run.pk}/").content.decode()

    assert f'<figcaption id="live-run-state" class="live-run-state">{words}</figcaption>' in page
    assert '<button class="btn" type="button" id="live-take" disabled' in page
    assert f"Take control is possible while the run&#x27;s browser is working; {why}." in page
    assert "a still page is redrawn about twice a second" in page


def test_a_running_run_offers_control_and_no_reason_against_it(
    operator: User, demo_workflow: Workflow
) -> None:
    run = launched(operator, demo_workflow)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    client = Client()
    client.force_login(operator)

    page = client.get(f"/runs/{run.pk}/").content.decode()

    assert '<button class="btn" type="button" id="live-take" aria-describedby' in page
    assert '<p id="live-take-why" class="muted" hidden></p>' in page


def test_the_live_area_shows_the_newest_picture_of_the_browser(
    operator: User, demo_workflow: Workflow, settings: Any, tmp_path: Path
) -> None:
    settings.RUN_FILES_DIR = tmp_path
    run = launched(operator, demo_workflow)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.AWAITING_APPROVAL)
    step_started = timezone.now() - timedelta(minutes=5)
    StepResult.objects.create(
        run=run, index=3, step_id="open", step_type="goto", sentence="Open the invoice",
        status=StepResult.Status.SUCCEEDED, started_at=step_started, duration_ms=1000,
        screenshot="steps/03.png",
    )  # fmt: skip
    run.refresh_from_db()

    assert (rendering.live_still(run).picture, rendering.live_still(run).picture_alt) == (
        "steps/03.png", "The run's browser after step 4",
    )  # fmt: skip
    # A viewer watched until the worker let go of the browser, after the step's picture.
    last_frame_keep(tmp_path / str(run.pk), b"jpeg", at=time.time())
    assert rendering.live_still(run).picture == LAST_FRAME
    # A frame from before the last step's picture (the viewer left early) is older news.
    last_frame_keep(tmp_path / str(run.pk), b"jpeg", at=step_started.timestamp())
    assert rendering.live_still(run).picture == "steps/03.png"
    # Nothing is left to show of a run whose files the retention policy deleted.
    Run.objects.filter(pk=run.pk).update(files_pruned_at=timezone.now())
    run.refresh_from_db()
    assert rendering.live_still(run).picture == ""
