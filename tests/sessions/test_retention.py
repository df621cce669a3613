from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from pytest_django.fixtures import Settings

from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from sessions import retention, services
from sessions.models import Run
from tests.factories import user_with_role
from workflows.models import Workflow

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def files_dir(settings: Settings, tmp_path: Path) -> Path:
    settings.RUN_FILES_DIR = tmp_path / "runs"
    return tmp_path / "runs"


def ended(operator: User, workflow: Workflow, *, days_ago: float, files_dir: Path) -> Run:
    run = services.run_launch(
        workflow_id=workflow.pk, user=operator, raw_inputs={"invoice": "INV-1001", "amount": "1"}
    )
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.SUCCEEDED, finished_at=timezone.now() - timedelta(days=days_ago)
    )
    (files_dir / str(run.pk)).mkdir(parents=True)
    (files_dir / str(run.pk) / "step-1.png").write_bytes(b"x" * 100)
    return run


def test_it_prunes_only_old_run_files_once_and_audits_each(
    operator: User, demo_workflow: Workflow, files_dir: Path
) -> None:
    old = ended(operator, demo_workflow, days_ago=40, files_dir=files_dir)
    recent = ended(operator, demo_workflow, days_ago=2, files_dir=files_dir)

    first = retention.run_files_prune(days=30)
    second = retention.run_files_prune(days=30)

    old.refresh_from_db()
    recent.refresh_from_db()
    assert first == [old.pk]
    assert second == []
    assert not (files_dir / str(old.pk)).exists()
    assert (files_dir / str(recent.pk) / "step-1.png").exists()
    assert old.files_pruned_at is not None
    assert recent.files_pruned_at is None
    event = AuditEvent.objects.get(action="run.files_pruned")
    assert event.object_id == str(old.pk)
    assert event.after == {"files": 1, "bytes": 100, "retention_days": 30}


def test_it_keeps_everything_when_no_retention_is_set(
    operator: User, demo_workflow: Workflow, files_dir: Path, settings: Settings
) -> None:
    settings.RUN_FILES_RETENTION_DAYS = 0
    run = ended(operator, demo_workflow, days_ago=400, files_dir=files_dir)

    assert retention.run_files_prune() == []
    assert (files_dir / str(run.pk) / "step-1.png").exists()
    assert not AuditEvent.objects.filter(action="run.files_pruned").exists()


def test_the_system_page_shows_capacity(
    operator: User, demo_workflow: Workflow, files_dir: Path, settings: Settings
) -> None:
    settings.RUN_FILES_RETENTION_DAYS = 30
    admin = user_with_role(Role.ADMINS, username="ada")
    queued = services.run_launch(
        workflow_id=demo_workflow.pk,
        user=operator,
        raw_inputs={"invoice": "INV-1002", "amount": "1"},
    )
    ended(operator, demo_workflow, days_ago=1, files_dir=files_dir)
    client = Client()
    client.force_login(admin)

    body = client.get("/system/").content.decode()

    assert "1 queued" in body
    assert f"/runs/{queued.pk}/" in body
    assert "100\xa0bytes in 1 file" in body
    assert "deleted 30 days after" in body
