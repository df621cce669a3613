"""The ``session:`` block of a workflow file: validation, import, publishing, the editor."""

from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User
from django.core.management import call_command

from pandaweb.core.roles import Role
from tests.factories import user_with_role
from workflows import services
from workflows.diff import document_diff
from workflows.fileformat import DocumentError, canonical_data, dump_document, load_document
from workflows.models import Credential, Workflow, WorkflowVersion
from workflows.schema import WorkflowDocument, credentials_used, document_problems

EXAMPLE = Path(__file__).resolve().parents[2] / "workflows" / "examples"
SESSION_EXAMPLE = EXAMPLE / "acme-download-invoices.yaml"
KINDS = {"acme-portal": "username_password", "acme-api": "api_token"}


def example() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(SESSION_EXAMPLE.read_text())
    return data


def problems_of(data: dict[str, Any]) -> list[str]:
    document = WorkflowDocument.model_validate(data)
    session_steps = list(document.session.steps) if document.session else None
    return [
        f"{p.where(list(document.steps), session_steps=session_steps)}: {p.message}"
        for p in document_problems(document, credential_kinds=KINDS)
    ]


def test_the_session_example_is_valid_and_survives_a_round_trip() -> None:
    document = load_document(SESSION_EXAMPLE.read_text())

    assert document.session is not None
    assert [s.id for s in document.session.steps] == [
        "open-login",
        "log-in",
        "wait-dashboard",
        "accept-cookies",
    ]
    assert document.session.rebake_every_hours == 12
    assert document_problems(document, credential_kinds=KINDS) == []
    assert load_document(dump_document(document)) == document
    assert list(canonical_data(document)["session"]["steps"][1])[:2] == ["id", "type"]
    # The run's own steps type no credential: forks never need it.
    assert credentials_used(list(document.steps)) == set()
    assert credentials_used(list(document.session.steps)) == {"acme-portal"}


def test_a_file_without_a_session_block_is_unchanged() -> None:
    text = (EXAMPLE / "acme-pay-invoice.yaml").read_text()
    document = load_document(text)

    assert document.session is None
    assert "session" not in canonical_data(document)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: d["session"]["steps"].append(
                {"id": "pay", "type": "click", "irreversible": True,
                 "target": {"role": "button", "name": "Pay"}}
            ),
            "session step 5 'pay', field irreversible: session steps run on every bake without "
            "anyone's approval; an irreversible step belongs to the run's steps",
        ),
        (
            lambda d: d["session"]["steps"].append(
                {"id": "grab", "type": "extract",
                 "fields": [{"name": "x", "kind": "text", "target": {"text": "x"}}]}
            ),
            "session step 5 'grab', field type: a session template only logs in; extract steps "
            "belong to the run's steps",
        ),
        (
            lambda d: d["session"]["steps"][0].update(
                url="http://127.0.0.1:8001/login?month={{ params.month }}"
            ),
            "session step 1 'open-login', field url: session steps run once for many runs, so "
            "they cannot use params ('{{ params.month }}')",
        ),
        (
            lambda d: d["session"]["steps"][1].update(credential="other-portal"),
            "session step 2 'log-in', field credential: credential 'other-portal' is not among "
            "this workflow's credentials (settings → credentials)",
        ),
        (
            lambda d: d["session"].update(check_url="http://evil.example/"),
            "session.check_url: evil.example is not in the allowed hosts (127.0.0.1:8001)",
        ),
        (
            lambda d: d["session"].update(check_url="http://127.0.0.1:8001/{{ params.month }}"),
            "session.check_url: the check URL is the same for every run: it cannot use {{ … }}",
        ),
        (
            lambda d: d["steps"][0].update(id="log-in"),
            "step 1 'log-in', field id: duplicate step id 'log-in' (a session step has it)",
        ),
        (
            lambda d: d["session"]["steps"].append(
                {"id": "log-in", "type": "wait_for", "text": "Open invoices"}
            ),
            "session step 5 'log-in', field id: duplicate step id 'log-in'",
        ),
    ],
)  # fmt: skip
def test_a_bad_session_block_is_a_problem_that_names_its_step(change: Any, expected: str) -> None:
    data = example()
    change(data)

    assert problems_of(data) == [expected]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: d["session"].update(rebake_every_hours=0),
            "line 42, session.rebake_every_hours: Input should be greater than or equal to 1",
        ),
        (
            lambda d: d["session"].update(rebake_every_hours=169),
            "line 42, session.rebake_every_hours: Input should be less than or equal to 168",
        ),
        (
            lambda d: d["session"].update(steps=[]),
            "line 15, session.steps: List should have at least 1 item after validation, not 0",
        ),
        (lambda d: d["session"].pop("logged_in"), "line 14, session.logged_in: is required"),
        (
            lambda d: d["session"].update(logged_in={"role": "button", "text": "Log out"}),
            "line 39, session.logged_in: give exactly one of role, label, placeholder, text, "
            "test_id or css (got role, text)",
        ),
        (
            lambda d: d["session"].update(remember_me=True),
            "line 43, session.remember_me: is not a known field",
        ),
    ],
)  # fmt: skip
def test_a_malformed_session_block_is_refused_with_its_line(change: Any, expected: str) -> None:
    data = example()
    change(data)
    text = yaml.safe_dump(data, sort_keys=False)

    with pytest.raises(DocumentError) as refused:
        load_document(text)

    assert [str(p) for p in refused.value.problems] == [expected]


def test_importing_and_publishing_keeps_the_session_block(
    operator: User, acme_credential: Credential
) -> None:
    workflow = services.workflow_import(user=operator, text=SESSION_EXAMPLE.read_text())
    draft = workflow.versions.get()
    assert draft.session is not None
    assert [s["id"] for s in draft.session["steps"]][1] == "log-in"

    version = services.workflow_publish(workflow_id=workflow.pk, user=operator, message="first")

    assert version.document is not None
    assert version.document["session"]["check_url"] == "http://127.0.0.1:8001/"
    assert version.document["session"]["logged_in"] == {"role": "button", "name": "Log out"}
    # The next draft starts from it, session included, and the editor keeps ids unique.
    services.step_save(
        workflow_id=workflow.pk,
        user=operator,
        data={"id": "settle", "type": "wait_for", "network_idle": True},
    )
    assert workflow.versions.get(status="draft").session == draft.session
    with pytest.raises(services.WorkflowError) as refused:
        services.step_save(
            workflow_id=workflow.pk,
            user=operator,
            data={"id": "log-in", "type": "wait_for", "network_idle": True},
        )
    assert refused.value.field_errors == {"id": ["another step already has the id 'log-in'"]}


def test_import_names_the_session_step_and_line_of_a_problem(
    operator: User, acme_credential: Credential
) -> None:
    text = SESSION_EXAMPLE.read_text().replace(
        "url: http://127.0.0.1:8001/login", "url: http://elsewhere.example/login"
    )

    with pytest.raises(services.ImportRefused) as refused:
        services.workflow_import(user=operator, text=text)

    assert [str(p) for p in refused.value.problems] == [
        "line 18, session step 1 'open-login', field url: elsewhere.example is not in the "
        "allowed hosts (127.0.0.1:8001)"
    ]


def test_comparing_versions_shows_session_changes() -> None:
    old = canonical_data(load_document(SESSION_EXAMPLE.read_text()))
    new = copy.deepcopy(old)
    new["session"]["rebake_every_hours"] = 4

    entries = document_diff(old, new)

    assert [(e.section, e.kind, e.label) for e in entries] == [
        ("session", "changed", "Session template")
    ]
    assert [(c.path, c.old, c.new) for c in entries[0].changes] == [("rebake_every_hours", None, 4)]


def test_the_demo_set_up_publishes_every_example_once(db: None) -> None:
    call_command("setup_roles", "--demo-users", stdout=io.StringIO())
    out = io.StringIO()

    call_command("demo_workflow", stdout=out)
    call_command("demo_workflow", stdout=out)

    published = {
        w.slug: w.versions.get(number=1).document for w in Workflow.objects.order_by("slug")
    }
    assert list(published) == ["acme-change-payout", "acme-download-invoices", "acme-pay-invoice"]
    assert published["acme-download-invoices"]["session"]["logged_in"]["name"] == "Log out"  # type: ignore[index]
    assert "session" not in published["acme-pay-invoice"]  # type: ignore[operator]
    assert Credential.objects.get().name == "acme-portal"
    # The second call finds each workflow already aimed at the configured portal: no new version.
    assert "demo workflow 'acme-download-invoices' aims at 127.0.0.1:8001" in out.getvalue()
    assert not WorkflowVersion.objects.filter(number__gt=1).exists()


# The editor -------------------------------------------------------------------------------------


def _editor(user: User) -> Any:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


def _workflow_without_session(operator: User, acme_credential: Credential) -> Workflow:
    data = example()
    data.pop("session")
    data["steps"].insert(0, {"id": "open-login", "type": "goto", "url": "http://127.0.0.1:8001/"})
    workflow = services.workflow_import(user=operator, text=yaml.safe_dump(data, sort_keys=False))
    services.workflow_publish(workflow_id=workflow.pk, user=operator, message="first")
    return workflow


def test_an_author_writes_a_session_template_in_the_editor(
    operator: User, acme_credential: Credential
) -> None:
    from pandaweb.audit.models import AuditEvent

    workflow = _workflow_without_session(operator, acme_credential)
    client = _editor(operator)
    base = f"/workflows/{workflow.slug}"
    assert "Add a session template" in client.get(f"{base}/").content.decode()

    check = client.post(
        f"{base}/session/",
        {"check_url": "http://127.0.0.1:8001/", "logged_in": 'button "Log out"',
         "rebake_every_hours": "6"},
        HTTP_HX_REQUEST="true",
    )  # fmt: skip
    assert check["HX-Retarget"] == "#draft"
    login = {"type": "login", "id": "log-in", "credential": "acme-portal", "timeout_ms": 10000,
             "username_target": "label Username", "password_target": "label Password",
             "submit_target": 'button "Sign in"'}  # fmt: skip
    client.post(f"{base}/session/steps/add/", login, HTTP_HX_REQUEST="true")
    opened = client.post(
        f"{base}/session/steps/add/",
        {"type": "goto", "id": "login-page", "url": "http://127.0.0.1:8001/login",
         "timeout_ms": 10000},
        HTTP_HX_REQUEST="true",
    )  # fmt: skip
    assert "Log in with credential &#x27;acme-portal&#x27;" in opened.content.decode()
    client.post(f"{base}/session/steps/1/up/", {"step_id": "login-page"}, HTTP_HX_REQUEST="true")

    draft = workflow.versions.get(status="draft")
    assert draft.session == {
        "steps": [
            {"id": "login-page", "type": "goto", "url": "http://127.0.0.1:8001/login"},
            {"id": "log-in", "type": "login", "credential": "acme-portal",
             "username": {"label": "Username"}, "password": {"label": "Password"},
             "submit": {"role": "button", "name": "Sign in"}},
        ],
        "check_url": "http://127.0.0.1:8001/",
        "logged_in": {"role": "button", "name": "Log out"},
        "rebake_every_hours": 6,
    }  # fmt: skip
    assert draft.steps[0]["id"] == "open-login"  # the run's steps are untouched
    page = client.get(f"{base}/").content.decode()
    assert "Edit the check" in page
    assert 'id="session-step-1"' in page
    assert "must show <strong>the button &#x27;Log out&#x27;</strong>" in page
    version = services.workflow_publish(workflow_id=workflow.pk, user=operator, message="session")
    assert version.document is not None
    assert version.document["session"] == draft.session
    assert AuditEvent.objects.filter(action="workflow.session_changed").count() == 1
    assert AuditEvent.objects.filter(action="workflow.step_added", extra__session=True).count() == 2


def test_the_editor_refuses_what_a_session_template_may_not_do(
    operator: User, acme_credential: Credential
) -> None:
    workflow = _workflow_without_session(operator, acme_credential)
    client = _editor(operator)
    base = f"/workflows/{workflow.slug}"

    bad_check = client.post(
        f"{base}/session/",
        {"check_url": "http://127.0.0.1:8001/{{ params.month }}", "logged_in": 'buton "Out"',
         "rebake_every_hours": "500"},
    )  # fmt: skip
    body = bad_check.content.decode()
    assert "&#x27;buton&#x27; is not a role" in body
    assert "Ensure this value is less than or equal to 168." in body
    assert client.get(f"{base}/session/steps/add/?type=extract").status_code == 404
    assert client.get(f"{base}/session/steps/add/?type=wait").status_code == 200
    assert (
        "Irreversible" not in client.get(f"{base}/session/steps/add/?type=click").content.decode()
    )
    clash = client.post(
        f"{base}/session/steps/add/",
        {"type": "goto", "id": "open-login", "url": "http://127.0.0.1:8001/login",
         "timeout_ms": 10000},
    )  # fmt: skip
    assert "another step already has the id &#x27;open-login&#x27;" in clash.content.decode()
    with pytest.raises(services.WorkflowError) as refused:
        services.step_save(
            workflow_id=workflow.pk,
            user=operator,
            data={"id": "pay", "type": "click", "irreversible": True,
                  "target": {"role": "button", "name": "Pay"}},
            session=True,
        )  # fmt: skip
    assert "irreversible" in refused.value.field_errors
    reviewer = _editor(user_with_role(Role.REVIEWERS))
    assert reviewer.get(f"{base}/session/").status_code == 403
    assert reviewer.post(f"{base}/session/remove/").status_code == 403
    assert not workflow.versions.filter(status="draft").exists()


def test_removing_the_session_template_from_the_draft(
    operator: User, acme_credential: Credential
) -> None:
    workflow = services.workflow_import(user=operator, text=SESSION_EXAMPLE.read_text())
    client = _editor(operator)

    client.post(f"/workflows/{workflow.slug}/session/remove/", HTTP_HX_REQUEST="true")

    assert workflow.versions.get(status="draft").session is None
    page = client.get(f"/workflows/{workflow.slug}/").content.decode()
    assert "Add a session template" in page
