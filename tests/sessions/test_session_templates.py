"""Session templates for real: bakes and forked runs in local sandboxes (system Chromium) behind
their egress proxies, against the bundled demo portal on loopback."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from pandaweb.audit.models import AuditEvent
from pandaweb.demo_portal.server import PortalServer
from pandaweb.demo_portal.state import DEMO_USERNAME
from sessions import services
from sessions.engine.driver import with_browser
from sessions.engine.sandbox.base import Sandbox, SandboxSpec
from sessions.engine.sandbox.local import LocalBackend
from sessions.engine.vocabulary import STALE_SESSION
from sessions.models import Run, SessionTemplate
from sessions.services import baking, execution
from tests.demo_portal.conftest import fetch_json
from tests.sessions.conftest import processes_with, publish, session_document
from workflows import services as workflow_services
from workflows.models import Credential, Workflow
from workflows.vault import Vault

pytestmark = [
    pytest.mark.usefixtures("run_files_in_tmp"),
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]

MAIN_STEPS = ["open-invoices", "read-invoices", "open-newest", "read-newest", "download-csv"]


@pytest.fixture
def downloads(operator: User, acme_credential: Credential, portal: str) -> Workflow:
    return publish(operator, session_document(portal))


def bake(workflow: Workflow, user: User | None) -> SessionTemplate:
    version = workflow.versions.get(number=1)
    requested = services.template_request_bake(version_id=version.pk, user=user, backend="local")
    return baking.template_bake(template_id=requested.pk)


def execute(run: Run) -> Run:
    execution.run_execute(run_id=run.pk)
    run.refresh_from_db()
    return run


def storage_state(template: SessionTemplate) -> dict[str, Any]:
    state: dict[str, Any] = json.loads(
        Vault(settings.CREDENTIAL_KEYS).open(template.state)["storage_state"]
    )
    return state


def cookie(state: dict[str, Any], name: str) -> str | None:
    return next((c["value"] for c in state["cookies"] if c["name"] == name), None)


def test_a_bake_logs_in_once_and_keeps_the_session_only_encrypted(
    operator: User, downloads: Workflow, portal_server: PortalServer
) -> None:
    template = bake(downloads, operator)

    assert template.status == SessionTemplate.Status.READY, template.failure_reason
    assert (template.host, template.state_path, template.requested_by) == ("", "", operator)
    state = storage_state(template)
    session = cookie(state, "acme_session")
    assert session is not None
    assert portal_server.state.session_user(session).username == DEMO_USERNAME  # type: ignore[union-attr]
    assert cookie(state, "acme_cookies") == "accepted"  # the session steps answered the banner
    # At rest it is ciphertext: neither the cookie nor its name can be read from the row.
    assert session not in template.state
    assert "acme_session" not in template.state
    actions = AuditEvent.objects.filter(object_type="session_template", object_id=str(template.pk))
    assert list(actions.values_list("action", flat=True)) == [
        "session_template.bake_requested",
        "session_template.baked",
    ]
    used = AuditEvent.objects.get(action="credential.used")
    assert used.extra == {"session_template": template.pk}
    assert session not in json.dumps(list(AuditEvent.objects.values("before", "after", "extra")))
    assert processes_with(f"bake-{template.pk}-") == []


def test_a_forked_run_starts_logged_in_without_the_login_or_the_credential(
    operator: User,
    downloads: Workflow,
    acme_credential: Credential,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    template = bake(downloads, operator)
    opened: list[str] = []
    original = Vault.open

    def spy(vault: Vault, token: str) -> dict[str, str]:
        opened.append(token)
        return original(vault, token)

    monkeypatch.setattr(Vault, "open", spy)
    run = services.run_launch(workflow_id=downloads.pk, user=operator, raw_inputs={})

    run = execute(run)

    steps = list(run.step_results.order_by("index"))
    assert run.status == Run.Status.SUCCEEDED, (run.failure_reason, [s.error for s in steps])
    assert [s.step_id for s in steps] == MAIN_STEPS
    assert [s.index for s in steps] == [0, 1, 2, 3, 4]
    assert run.session_template_id == template.pk
    # The run read the template's state, never the credential, and typed no login.
    assert acme_credential.ciphertext not in opened
    assert template.state in opened
    assert not AuditEvent.objects.filter(action="credential.used", run_id=run.pk).exists()
    assert not run.events.filter(type="session_template").exists()
    assert len(run.outputs["invoices"]) == 10
    assert run.artifacts.get(name="invoice_csv").size > 0
    assert run.sandbox_facts["backend"] == "local"
    assert "session template" in run.sandbox_facts["start"]
    client = Client()
    client.force_login(operator)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert f"Forked from session template #{template.pk} baked" in page
    assert "by olivia" in page


def test_runs_forked_from_one_template_at_once_each_start_logged_in_and_share_no_cookie(
    operator: User, acme_credential: Credential, portal_server: PortalServer, portal: str
) -> None:
    document = session_document(portal)
    # The banner is left unanswered in the template: each run answers it in its own browser.
    document["session"]["steps"] = document["session"]["steps"][:3]
    document["parameters"] = [{"name": "page", "type": "string", "required": False}]
    document["steps"] = [
        {"id": "open", "type": "goto", "url": f"{portal}/{{{{ params.page }}}}"},
        {"id": "fresh", "type": "assert", "checks": [
            {"kind": "text_present", "text": "We use cookies"},
            {"kind": "element_count", "target": {"role": "button", "name": "Log out"},
             "count": 1},
        ]},
        {"id": "accept", "type": "click", "target": {"role": "button", "name": "Accept"}},
        {"id": "answered", "type": "assert", "checks": [
            {"kind": "text_absent", "text": "We use cookies"},
        ]},
    ]  # fmt: skip
    workflow = publish(operator, document)
    template = bake(workflow, operator)
    assert template.status == SessionTemplate.Status.READY, template.failure_reason
    # The second run's first page answers only once the first run has answered the banner in
    # its own browser: the second then looks for the banner in its own. (Not "/": each run's
    # session check asks for it.)
    answered = threading.Event()
    portal_server.held_paths = {r"^/invoices$": answered}
    first = services.run_launch(workflow_id=workflow.pk, user=operator, raw_inputs={})
    second = services.run_launch(
        workflow_id=workflow.pk, user=operator, raw_inputs={"page": "invoices"}
    )

    threads = [
        threading.Thread(target=execution.run_execute, kwargs={"run_id": r.pk})
        for r in (first, second)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 120
    while not first.step_results.filter(step_id="accept").exists():
        assert time.monotonic() < deadline, "the first run never answered the banner"
        time.sleep(0.05)
    answered.set()
    for thread in threads:
        thread.join(timeout=120)

    for run in (first, second):
        run.refresh_from_db()
        steps = list(run.step_results.order_by("index"))
        assert run.status == Run.Status.SUCCEEDED, (
            run.pk,
            run.failure_reason,
            [s.error for s in steps],
        )
        assert [s.step_id for s in steps] == ["open", "fresh", "accept", "answered"]
        assert run.session_template_id == template.pk
    answered_first = first.step_results.get(step_id="accept").started_at
    assert second.step_results.get(step_id="fresh").started_at > answered_first
    template.refresh_from_db()
    assert template.status == SessionTemplate.Status.READY
    assert cookie(storage_state(template), "acme_cookies") is None


def test_a_template_that_woke_up_logged_out_fails_the_run_and_is_never_rebaked_silently(
    operator: User, downloads: Workflow, portal: str
) -> None:
    template = bake(downloads, operator)
    assert fetch_json(f"{portal}/api/sessions/expire", method="POST") == {"closed": 1}
    run = services.run_launch(workflow_id=downloads.pk, user=operator, raw_inputs={})

    run = execute(run)

    assert run.status == Run.Status.FAILED
    assert run.failure_reason == STALE_SESSION == "session template is stale — re-bake"
    assert not run.step_results.exists()
    template.refresh_from_db()
    assert template.status == SessionTemplate.Status.STALE
    assert template.state == ""
    assert template.stale_reason.startswith(f"run #{run.pk}: ")
    assert "Log out" in template.stale_reason
    stale = AuditEvent.objects.get(action="session_template.stale")
    assert stale.run_id == run.pk
    # The next run does not log in again behind anyone's back.
    again = execute(services.run_launch(workflow_id=downloads.pk, user=operator, raw_inputs={}))
    assert again.failure_reason == STALE_SESSION
    assert SessionTemplate.objects.count() == 1
    assert AuditEvent.objects.filter(action="credential.used").count() == 1  # the bake's
    client = Client()
    client.force_login(operator)
    run_page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'class="problem-box session-stale" role="alert"' in run_page
    assert "re-bake the session template" in run_page
    workflow_page = client.get(f"/workflows/{downloads.slug}/").content.decode()
    assert f"Session template #{template.pk} is stale — re-bake." in workflow_page


def test_the_first_run_of_a_version_bakes_the_template_inline_then_forks_it(
    operator: User, downloads: Workflow
) -> None:
    run = execute(services.run_launch(workflow_id=downloads.pk, user=operator, raw_inputs={}))

    assert run.status == Run.Status.SUCCEEDED, run.failure_reason
    template = SessionTemplate.objects.get()
    assert template.status == SessionTemplate.Status.READY
    assert run.session_template_id == template.pk
    assert template.requested_by == operator
    assert [s.step_id for s in run.step_results.order_by("index")] == MAIN_STEPS
    baking = run.events.get(type="session_template")
    assert baking.payload == {"phase": "baking", "template": template.pk}
    # The login was on this run's path, once: the bake typed the credential for it.
    assert AuditEvent.objects.filter(action="credential.used", run_id=run.pk).count() == 1
    later = execute(services.run_launch(workflow_id=downloads.pk, user=operator, raw_inputs={}))
    assert later.status == Run.Status.SUCCEEDED, later.failure_reason
    assert later.session_template_id == template.pk
    assert not later.events.filter(type="session_template").exists()
    assert AuditEvent.objects.filter(action="credential.used").count() == 1


def test_a_failed_bake_fails_the_runs_until_someone_rebakes(
    operator: User, downloads: Workflow, acme_credential: Credential
) -> None:
    wrong = "not-the-portal-password"
    workflow_services.credential_replace_value(
        credential_id=acme_credential.pk,
        user=operator,
        values={"username": DEMO_USERNAME, "password": wrong},
    )

    run = execute(services.run_launch(workflow_id=downloads.pk, user=operator, raw_inputs={}))

    template = SessionTemplate.objects.get()
    assert template.status == SessionTemplate.Status.FAILED
    # The login step itself fails, in the portal's words, instead of a later wait timing out.
    assert template.failure_reason == (
        "session step 'log-in': the portal refused: Invalid username or password"
    )
    assert run.status == Run.Status.FAILED
    assert run.failure_reason == (
        f"the session template could not be baked ({template.failure_reason}) — re-bake"
    )
    assert wrong not in run.failure_reason
    again = execute(services.run_launch(workflow_id=downloads.pk, user=operator, raw_inputs={}))
    assert again.failure_reason == run.failure_reason
    assert SessionTemplate.objects.count() == 1


class SavedBrowserBackend(LocalBackend):
    """Stands in for a backend that saves whole VMs (the microVM one): its 'snapshot' is the
    browser's cookies in a file, and a sandbox created from that file wakes up with them."""

    name = "saved-browser"

    def create(self, spec: SandboxSpec) -> Sandbox:
        sandbox = super().create(dataclasses.replace(spec, restore_from=""))
        sandbox.backend = self.name
        if spec.restore_from:
            cookies = json.loads(Path(spec.restore_from).read_text())["cookies"]
            with_browser(sandbox.cdp_url, lambda browser: browser.contexts[0].add_cookies(cookies))
        sandbox.details.update(
            start="session template fork" if spec.restore_from else "cold boot",
            accelerator="TCG (software emulation)",
            accelerator_warning="no KVM on this host: browsers run 10-60x slower",
            time_scale=2.0,
        )
        return sandbox

    def snapshot(self, sandbox: Sandbox, destination: Path) -> None:
        try:
            state = with_browser(
                sandbox.cdp_url, lambda browser: browser.contexts[0].storage_state()
            )
            destination.write_text(json.dumps(state))
            destination.with_name(destination.name + ".json").write_text("{}")
        finally:
            self.destroy(sandbox)


def test_a_backend_that_saves_whole_vms_forks_runs_from_the_file_on_its_host(
    operator: User,
    downloads: Workflow,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    from sessions.engine.sandbox import backends

    monkeypatch.setitem(backends._FACTORIES, "saved-browser", SavedBrowserBackend)
    monkeypatch.setattr(settings, "SANDBOX_BACKEND", "saved-browser")
    version = downloads.versions.get(number=1)
    requested = services.template_request_bake(
        version_id=version.pk, user=operator, backend="saved-browser"
    )

    first = baking.template_bake(template_id=requested.pk)

    assert first.status == SessionTemplate.Status.READY, first.failure_reason
    assert (first.state, first.host) == ("", socket.gethostname())
    saved = Path(first.state_path)
    assert saved.parent == tmp_path / "session-templates"
    assert saved.is_file()
    run = execute(services.run_launch(workflow_id=downloads.pk, user=operator, raw_inputs={}))
    assert run.status == Run.Status.SUCCEEDED, run.failure_reason
    assert run.session_template_id == first.pk
    assert run.sandbox_facts["start"] == "session template fork"
    assert run.sandbox_facts["time_scale"] == 2.0
    client = Client()
    client.force_login(operator)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "<dt>Accelerator</dt><dd>TCG (software emulation)</dd>" in page
    assert "no KVM on this host: browsers run 10-60x slower" in page

    again = services.template_request_bake(
        version_id=version.pk, user=operator, backend="saved-browser"
    )
    second = baking.template_bake(template_id=again.pk)

    assert second.status == SessionTemplate.Status.READY, second.failure_reason
    first.refresh_from_db()
    assert (first.status, first.state_path) == (SessionTemplate.Status.RETIRED, "")
    assert not saved.exists()
    assert not saved.with_name(saved.name + ".json").exists()
    assert Path(second.state_path).is_file()
