"""Session templates without a browser: requests, the schedule, staleness, the pages."""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import pytest
import time_machine
import yaml
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from sessions import services
from sessions.engine.sandbox import backends
from sessions.engine.vocabulary import STALE_SESSION
from sessions.models import Run, SessionTemplate
from sessions.services import baking, execution
from tests.factories import user_with_role
from tests.patching import patch_where_used
from tests.sessions.conftest import publish, session_document
from workflows import services as workflow_services
from workflows.models import Credential, Workflow, WorkflowVersion

pytestmark = pytest.mark.django_db

PORTAL = "http://127.0.0.1:8001"
READY = SessionTemplate.Status.READY


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The bakes queued (none runs here)."""
    sent: list[dict[str, Any]] = []
    for module in (services.runstate, services.templates):
        monkeypatch.setattr(
            module, "dispatch", lambda task, **kwargs: sent.append({"task": task.name, **kwargs})
        )
    return sent


@pytest.fixture
def downloads(operator: User, acme_credential: Credential) -> Workflow:
    return publish(operator, session_document(PORTAL))


def latest(workflow: Workflow) -> WorkflowVersion:
    return workflow.versions.filter(status="published").order_by("-number").first()  # type: ignore[return-value]


def ready_template(workflow: Workflow, *, baked_at: Any = None, **fields: Any) -> SessionTemplate:
    values = {"status": READY, "state": "gAAAA-not-a-real-token", **fields}
    return SessionTemplate.objects.create(
        version=latest(workflow), backend="local", baked_at=baked_at or timezone.now(), **values
    )


def test_a_bake_request_is_queued_once_while_it_bakes(
    operator: User, downloads: Workflow, queued: list[dict[str, Any]]
) -> None:
    version = latest(downloads)

    first = services.template_request_bake(version_id=version.pk, user=operator, backend="local")
    second = services.template_request_bake(version_id=version.pk, user=None, backend="local")

    assert first.pk == second.pk
    assert first.status == SessionTemplate.Status.BAKING
    assert first.requested_by == operator
    assert queued == [
        {"task": "runs.bake_session_template", "template_id": first.pk, "queue": None}
    ]
    event = AuditEvent.objects.get(action="session_template.bake_requested")
    assert (event.actor_id, event.object_id) == (operator.pk, str(first.pk))
    assert event.extra == {"workflow": downloads.slug, "version": 1, "backend": "local"}


def test_a_bake_is_refused_for_a_workflow_without_a_session_template(
    operator: User, demo_workflow: Workflow, queued: list[dict[str, Any]]
) -> None:
    with pytest.raises(services.TemplateError, match="version 1 has no session template"):
        services.template_request_bake(
            version_id=latest(demo_workflow).pk, user=operator, backend="local"
        )

    assert not SessionTemplate.objects.exists()
    assert queued == []


def test_a_second_delivery_of_the_bake_task_does_nothing(
    operator: User, downloads: Workflow, queued: list[dict[str, Any]]
) -> None:
    template = services.template_request_bake(
        version_id=latest(downloads).pk, user=operator, backend="local"
    )
    SessionTemplate.objects.filter(pk=template.pk).update(bake_started_at=timezone.now())

    again = baking.template_bake(template_id=template.pk)

    assert again.status == SessionTemplate.Status.BAKING
    assert not AuditEvent.objects.filter(action="credential.used").exists()


def test_the_schedule_rebakes_ready_templates_when_they_are_due(
    downloads: Workflow, queued: list[dict[str, Any]]
) -> None:
    baked = timezone.now()
    template = ready_template(downloads, baked_at=baked)

    with time_machine.travel(baked + timedelta(hours=11, minutes=59)):
        assert services.template_rebake_due() == []
    with time_machine.travel(baked + timedelta(hours=12, minutes=1)):
        queued_now = services.template_rebake_due()
        assert services.template_rebake_due() == []  # it is baking: nothing more to queue

    fresh = SessionTemplate.objects.get(pk=queued_now[0])
    assert (fresh.status, fresh.requested_by, fresh.version_id) == (
        SessionTemplate.Status.BAKING,
        None,
        template.version_id,
    )
    assert [q["template_id"] for q in queued] == [fresh.pk]
    event = AuditEvent.objects.get(action="session_template.bake_requested")
    assert (event.actor_kind, event.actor_id) == (AuditEvent.ActorKind.SYSTEM, None)
    template.refresh_from_db()
    assert template.status == READY  # still forked until the new bake replaces it


def test_the_schedule_follows_the_workflows_rebake_hours(
    operator: User, acme_credential: Credential, queued: list[dict[str, Any]]
) -> None:
    document = session_document(PORTAL)
    document["session"]["rebake_every_hours"] = 2
    workflow = publish(operator, document)
    baked = timezone.now()
    ready_template(workflow, baked_at=baked)

    with time_machine.travel(baked + timedelta(hours=2, minutes=1)):
        assert len(services.template_rebake_due()) == 1


def test_the_schedule_retires_templates_of_superseded_versions_and_abandoned_bakes(
    operator: User, downloads: Workflow, queued: list[dict[str, Any]]
) -> None:
    old = ready_template(downloads)
    document = session_document(PORTAL)
    document["description"] = "v2"
    workflow_services.workflow_import(user=operator, text=yaml.safe_dump(document))
    workflow_services.workflow_publish(workflow_id=downloads.pk, user=operator, message="v2")
    lost = SessionTemplate.objects.create(
        version=latest(downloads), backend="local", bake_started_at=timezone.now()
    )

    with time_machine.travel(timezone.now() + timedelta(minutes=16)):
        assert services.template_rebake_due() == []

    old.refresh_from_db()
    lost.refresh_from_db()
    assert (old.status, old.state) == (SessionTemplate.Status.RETIRED, "")
    assert lost.status == SessionTemplate.Status.FAILED
    assert lost.failure_reason == "the worker baking it stopped answering"
    retired = AuditEvent.objects.get(action="session_template.retired")
    assert retired.after == {"status": "retired", "reason": "a newer version exists"}


def test_marking_a_template_stale_drops_its_state_once(downloads: Workflow) -> None:
    template = ready_template(downloads)

    services.template_mark_stale(template_id=template.pk, reason="run #7: logged out")
    services.template_mark_stale(template_id=template.pk, reason="run #8: logged out")

    template.refresh_from_db()
    assert (template.status, template.state) == (SessionTemplate.Status.STALE, "")
    assert template.stale_reason == "run #7: logged out"
    assert AuditEvent.objects.filter(action="session_template.stale").count() == 1


def test_a_run_of_a_stale_template_fails_before_any_browser_starts(
    operator: User, downloads: Workflow, monkeypatch: pytest.MonkeyPatch
) -> None:
    ready_template(downloads, status=SessionTemplate.Status.STALE, state="")

    def no_sandbox(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("no sandbox may start for a stale template")

    patch_where_used(monkeypatch, backends, "get_backend", no_sandbox)
    run = services.run_launch(workflow_id=downloads.pk, user=operator, raw_inputs={})

    execution.run_execute(run_id=run.pk)

    run.refresh_from_db()
    assert (run.status, run.failure_reason) == (Run.Status.FAILED, STALE_SESSION)
    assert SessionTemplate.objects.count() == 1


# Pages ----------------------------------------------------------------------------------------


def test_operators_rebake_from_the_workflow_page_and_strangers_are_refused(
    operator: User, downloads: Workflow, queued: list[dict[str, Any]]
) -> None:
    colleague = user_with_role(Role.OPERATORS, username="colin")
    stranger = user_with_role(Role.REVIEWERS, username="stella")
    url = f"/runs/session-templates/{downloads.slug}/bake/"
    clients = {}
    for user in (operator, colleague, stranger):
        clients[user.username] = Client()
        clients[user.username].force_login(user)

    owner_answer = clients["olivia"].post(url)
    colleague_answer = clients["colin"].post(url, HTTP_HX_REQUEST="true")
    stranger_answer = clients["stella"].post(url)

    template = SessionTemplate.objects.get()
    assert owner_answer.status_code == 302
    assert owner_answer["Location"] == f"/workflows/{downloads.slug}/"
    assert colleague_answer.status_code == 200
    assert 'id="session-template"' in colleague_answer.content.decode()
    assert f"Baking session template #{template.pk}" in colleague_answer.content.decode()
    assert stranger_answer.status_code == 403
    assert len(queued) == 1
    assert template.requested_by == operator
    assert (
        "Re-bake now" not in clients["stella"].get(f"/workflows/{downloads.slug}/").content.decode()
    )


def test_the_workflow_page_shows_the_template_and_a_stale_alert(
    operator: User, downloads: Workflow
) -> None:
    client = Client()
    client.force_login(operator)
    page = client.get(f"/workflows/{downloads.slug}/").content.decode()
    assert "Not baked yet" in page
    assert "Log in with credential &#x27;acme-portal&#x27;" in page
    assert "Re-bake now" in page

    template = ready_template(downloads, requested_by=operator)
    page = client.get(f"/workflows/{downloads.slug}/").content.decode()
    assert f'#{template.pk} <span class="status status-ready">Ready</span>' in page
    assert "by olivia" in page
    assert "cookies and local storage, encrypted" in page
    assert "every 12 h" in page

    services.template_mark_stale(template_id=template.pk, reason="run #3: no Log out button")
    page = client.get(f"/workflows/{downloads.slug}/").content.decode()
    assert 'class="problem-box" role="alert"' in page
    assert f"Session template #{template.pk} is stale — re-bake." in page
    assert "run #3: no Log out button" in page
    panel = client.get(f"/runs/session-templates/{downloads.slug}/")
    assert panel.status_code == 200
    assert "is stale — re-bake" in panel.content.decode()


def test_a_workflow_without_a_session_template_shows_no_panel(
    operator: User, demo_workflow: Workflow
) -> None:
    client = Client()
    client.force_login(operator)

    assert (
        'id="session-template"'
        not in client.get(f"/workflows/{demo_workflow.slug}/").content.decode()
    )
    assert client.get(f"/runs/session-templates/{demo_workflow.slug}/").status_code == 404


def test_the_run_page_shows_the_sandbox_facts_and_their_warnings(
    operator: User, demo_workflow: Workflow
) -> None:
    run = services.run_launch(
        workflow_id=demo_workflow.pk,
        user=operator,
        raw_inputs={"invoice": "INV-1001", "amount": "1.00"},
    )
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.FAILED,
        sandbox_ready_seconds=41.5,
        sandbox_facts={
            "backend": "microvm",
            "ready_seconds": 41.5,
            "accelerator": "TCG (software emulation)",
            "accelerator_warning": "no KVM here: expect browsers 10-60x slower",
            "start": "snapshot restore",
            "isolation": "microVM: a guest kernel of its own under QEMU",
            "isolation_warning": "the guest shares the host's network namespace",
        },
    )
    client = Client()
    client.force_login(operator)

    page = client.get(f"/runs/{run.pk}/").content.decode()

    assert "<dt>Sandbox</dt><dd>microvm, ready in 41.50 s</dd>" in page
    assert "<dt>Start</dt><dd>snapshot restore</dd>" in page
    assert "<dt>Accelerator</dt><dd>TCG (software emulation)</dd>" in page
    assert "<dt>Isolation</dt><dd>microVM: a guest kernel of its own under QEMU</dd>" in page
    assert (
        '<p class="warning-box" role="status"><strong>Accelerator:</strong> '
        "no KVM here: expect browsers 10-60x slower</p>"
    ) in page
    assert "<strong>Isolation:</strong> the guest shares the host&#x27;s network namespace" in page


def test_rotating_keys_reencrypts_saved_logins_with_the_credentials(
    downloads: Workflow, settings: Any
) -> None:
    from django.core.management import call_command

    from workflows.services import vault
    from workflows.vault import generate_key

    old_key = settings.CREDENTIAL_KEYS[0]
    template = ready_template(downloads, state=vault().seal({"storage_state": '{"cookies": []}'}))
    settings.CREDENTIAL_KEYS = [generate_key(), old_key]
    out = io.StringIO()

    call_command("credentials_reencrypt", stdout=out)

    settings.CREDENTIAL_KEYS = settings.CREDENTIAL_KEYS[:1]
    template.refresh_from_db()
    assert vault().open(template.state) == {"storage_state": '{"cookies": []}'}
    assert "re-encrypted 1 credential(s) and 1 session template state(s)" in out.getvalue()
    assert AuditEvent.objects.filter(action="session_template.keys_rotated").count() == 1
