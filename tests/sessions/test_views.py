from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from sessions import services
from sessions.models import Artifact, Run
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
