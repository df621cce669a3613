from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from pandaweb.core.roles import Role
from pandaweb.schedules.models import Batch, Schedule
from pandaweb.webhooks.models import Subscription
from sessions.models import Run
from tests.factories import user_with_role
from workflows.models import Workflow

pytestmark = pytest.mark.django_db

SCHEDULE = {
    "name": "Mornings",
    "cron": "0 6 * * 1-5",
    "timezone": "Europe/Berlin",
    "overlap": "skip",
    "missed": "run_once",
    "param_invoice": "INV-1001",
    "param_amount": "10.00",
    "param_iban": "DE97 2004 0060 0123 4567 89",
}


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_workflow_page_offers_schedules_and_batches_to_launchers(
    operator: User, demo_workflow: Workflow
) -> None:
    page = signed_in(operator).get(f"/workflows/{demo_workflow.slug}/").content.decode()
    reviewer_page = (
        signed_in(user_with_role(Role.REVIEWERS))
        .get(f"/workflows/{demo_workflow.slug}/")
        .content.decode()
    )

    assert "New schedule" in page
    assert "Batch launch from CSV" in page
    assert "Schedules and batches" in reviewer_page
    assert "New schedule" not in reviewer_page


def test_it_creates_a_schedule_and_shows_it_in_words_with_five_times(
    operator: User, demo_workflow: Workflow
) -> None:
    client = signed_in(operator)

    response = client.post(f"/schedules/new/{demo_workflow.slug}/", SCHEDULE, follow=True)

    schedule = Schedule.objects.get()
    assert schedule.owner == operator
    assert schedule.inputs["invoice"] == "INV-1001"
    body = response.content.decode()
    assert "at 06:00 on weekdays (Europe/Berlin)" in body
    assert body.count("<time datetime=") == 5


def test_it_shows_schedule_errors_next_to_the_fields(
    operator: User, demo_workflow: Workflow
) -> None:
    response = signed_in(operator).post(
        f"/schedules/new/{demo_workflow.slug}/",
        {**SCHEDULE, "cron": "every morning", "param_invoice": "1001"},
    )

    body = response.content.decode()
    assert "a cron expression has five fields" in body
    assert "must match the pattern" in body
    assert not Schedule.objects.exists()


def test_a_reviewer_may_not_create_pause_or_upload(operator: User, demo_workflow: Workflow) -> None:
    signed_in(operator).post(f"/schedules/new/{demo_workflow.slug}/", SCHEDULE)
    schedule = Schedule.objects.get()
    reviewer = signed_in(user_with_role(Role.REVIEWERS))

    assert reviewer.post(f"/schedules/new/{demo_workflow.slug}/", SCHEDULE).status_code == 403
    assert reviewer.post(f"/schedules/{schedule.pk}/pause/", {"paused": "1"}).status_code == 403
    assert reviewer.get(f"/batches/new/{demo_workflow.slug}/").status_code == 403
    schedule.refresh_from_db()
    assert schedule.paused is False
    assert Schedule.objects.count() == 1


def test_pausing_from_the_workflow_page(operator: User, demo_workflow: Workflow) -> None:
    client = signed_in(operator)
    client.post(f"/schedules/new/{demo_workflow.slug}/", SCHEDULE)
    schedule = Schedule.objects.get()

    response = client.post(f"/schedules/{schedule.pk}/pause/", {"paused": "1", "next": "workflow"})

    assert response["Location"] == f"/workflows/{demo_workflow.slug}/"
    schedule.refresh_from_db()
    assert schedule.paused is True
    assert schedule.next_fire_at is None


def test_a_bad_file_lists_every_problem_and_launches_nothing(
    operator: User, demo_workflow: Workflow
) -> None:
    upload = SimpleUploadedFile("x.csv", b"invoice,amount\nINV-1001,1.00\n1002,2.00\n")

    response = signed_in(operator).post(f"/batches/new/{demo_workflow.slug}/", {"file": upload})

    assert response.status_code == 400
    assert "Line 3, invoice: must match the pattern" in response.content.decode()
    assert not Batch.objects.exists()
    assert not Run.objects.exists()


def test_a_good_file_becomes_a_batch_page_with_outputs(
    operator: User, demo_workflow: Workflow
) -> None:
    client = signed_in(operator)
    upload = SimpleUploadedFile("x.csv", b"invoice,amount\nINV-1001,1.00\nINV-1002,2.00\n")

    response = client.post(f"/batches/new/{demo_workflow.slug}/", {"file": upload}, follow=True)

    batch = Batch.objects.get()
    body = response.content.decode()
    assert "Batch #" in body
    assert 'id="line-3"' in body
    assert "Approve" not in body  # approvals are reviewed on each run's own page
    outputs = client.get(f"/batches/{batch.pk}/outputs.csv")
    assert outputs["Content-Type"].startswith("text/csv")
    assert outputs.content.decode().splitlines()[0].startswith("line,run,status,invoice,amount")
    partial = client.get(f"/batches/{batch.pk}/", headers={"HX-Request": "true"}).content.decode()
    assert partial.startswith('\n<div id="batch-progress"') or partial.lstrip().startswith(
        '<div id="batch-progress"'
    )


def test_webhook_pages_are_for_admins_only(operator: User) -> None:
    admin = signed_in(user_with_role(Role.ADMINS))
    assert signed_in(operator).get("/webhooks/").status_code == 403

    response = admin.post(
        "/webhooks/new/",
        {"name": "ERP", "url": "http://127.0.0.1:9/hook", "events": ["run.finished"]},
    )

    body = response.content.decode()
    assert "not shown again" in body
    assert "whsec_" in body
    assert admin.get("/webhooks/").status_code == 200
    subscription = Subscription.objects.get()
    assert "whsec_" not in admin.get(f"/webhooks/{subscription.pk}/").content.decode()
    assert admin.get("/webhooks/deliveries/").status_code == 200


def test_the_form_previews_an_expression_in_words_with_its_next_times(operator: User) -> None:
    client = signed_in(operator)

    good = client.get("/schedules/preview/", {"cron": "0 6 * * 1-5", "timezone": "Europe/Berlin"})
    bad = client.get("/schedules/preview/", {"cron": "0 6 * *", "timezone": "UTC"})

    assert "Launches at 06:00 on weekdays (Europe/Berlin)." in good.content.decode()
    assert good.content.decode().count("<time ") == 5
    assert "a cron expression has five fields" in bad.content.decode()
