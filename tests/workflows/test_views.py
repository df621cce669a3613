from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from tests.factories import user_with_role
from tests.workflows.conftest import EXAMPLE
from workflows import services
from workflows.forms import WorkflowSettingsForm
from workflows.models import Credential, Workflow

pytestmark = pytest.mark.django_db


@pytest.fixture
def workflow(operator: User, acme_credential: Credential) -> Workflow:
    workflow = services.workflow_import(user=operator, text=EXAMPLE.read_bytes())
    services.workflow_publish(workflow_id=workflow.pk, user=operator, message="v1")
    return workflow


def client_for(role: Role) -> Client:
    client = Client()
    client.force_login(user_with_role(role))
    return client


@pytest.mark.parametrize("role", [Role.REVIEWERS, Role.COMPLIANCE])
def test_reviewers_and_compliance_read_but_cannot_edit(role: Role, workflow: Workflow) -> None:
    client = client_for(role)
    slug = workflow.slug
    events = AuditEvent.objects.count()

    page = client.get(f"/workflows/{slug}/")
    assert page.status_code == 200
    assert "Click the button &#x27;Submit payment&#x27; — irreversible" in page.content.decode()
    assert "Add a step" not in page.content.decode()
    assert client.get(f"/workflows/{slug}/versions/1/").status_code == 200
    assert client.get(f"/workflows/{slug}/diff/").status_code == 200
    for url in (
        f"/workflows/{slug}/settings/",
        f"/workflows/{slug}/steps/add/?type=click",
        "/workflows/new/",
        "/workflows/import/",
    ):
        assert client.get(url).status_code == 403, url
    for url in (
        f"/workflows/{slug}/steps/0/delete/",
        f"/workflows/{slug}/publish/",
        f"/workflows/{slug}/archive/",
    ):
        assert client.post(url, {"step_id": "open-login", "message": "x"}).status_code == 403, url
    assert AuditEvent.objects.count() == events
    assert len(workflow.versions.get(number=1).steps) == 17


def test_an_operator_adds_a_step_through_htmx_and_gets_the_draft_back(
    operator: User, workflow: Workflow
) -> None:
    client = Client()
    client.force_login(operator)

    response = client.post(
        f"/workflows/{workflow.slug}/steps/add/",
        {"type": "click", "target": 'link "Invoices"', "id": "to-invoices", "timeout_ms": 10000},
        HTTP_HX_REQUEST="true",
    )

    assert response.status_code == 200
    assert response["HX-Retarget"] == "#draft"
    assert response["HX-Reswap"] == "outerHTML"
    assert "Click the link &#x27;Invoices&#x27;" in response.content.decode()
    draft = workflow.versions.get(status="draft")
    assert draft.steps[-1] == {
        "id": "to-invoices",
        "type": "click",
        "target": {"role": "link", "name": "Invoices"},
    }


def test_a_bad_step_comes_back_with_errors_in_place(operator: User, workflow: Workflow) -> None:
    client = Client()
    client.force_login(operator)

    response = client.post(
        f"/workflows/{workflow.slug}/steps/add/",
        {"type": "click", "target": 'buton "Pay"', "id": "open-login", "timeout_ms": 10000},
        HTTP_HX_REQUEST="true",
    )

    body = response.content.decode()
    assert response.status_code == 200
    assert "HX-Retarget" not in response
    assert "&#x27;buton&#x27; is not a role" in body
    assert not workflow.versions.filter(status="draft").exists()


def test_publishing_from_the_page_needs_a_message(operator: User, workflow: Workflow) -> None:
    client = Client()
    client.force_login(operator)
    services.step_save(
        workflow_id=workflow.pk, user=operator, data={"id": "extra", "type": "press", "key": "Tab"}
    )

    refused = client.post(f"/workflows/{workflow.slug}/publish/", {"message": " "}, follow=True)
    published = client.post(
        f"/workflows/{workflow.slug}/publish/", {"message": "Press tab"}, follow=True
    )

    assert "say what changed in this version" in refused.content.decode()
    assert "Published version 2." in published.content.decode()
    assert workflow.versions.filter(status="published").count() == 2


def test_export_downloads_the_canonical_file(workflow: Workflow) -> None:
    client = client_for(Role.COMPLIANCE)

    response = client.get(f"/workflows/{workflow.slug}/versions/1/export.yaml")

    assert response["Content-Disposition"] == 'attachment; filename="acme-pay-invoice-v1.yaml"'
    assert response.content.decode().startswith("pandaweb: 1\nname: Pay an Acme invoice\n")
    assert AuditEvent.objects.filter(action="workflow.exported").count() == 1


def test_import_page_lists_every_problem_and_saves_nothing(operator: User) -> None:
    client = Client()
    client.force_login(operator)
    upload = SimpleUploadedFile("w.yaml", EXAMPLE.read_bytes())

    response = client.post("/workflows/import/", {"file": upload})

    assert response.status_code == 200
    assert "Nothing was imported." in response.content.decode()
    assert "there is no credential named &#x27;acme-portal&#x27;" in response.content.decode()
    assert not Workflow.objects.exists()


def test_importing_an_unchanged_file_says_so_on_the_workflow_s_page(
    operator: User, workflow: Workflow
) -> None:
    client = Client()
    client.force_login(operator)
    _, text = services.version_export(
        version_id=workflow.versions.get(number=1).pk, user=operator, fmt="yaml"
    )

    response = client.post(
        "/workflows/import/", {"file": SimpleUploadedFile("w.yaml", text.encode())}, follow=True
    )

    body = response.content.decode()
    assert "Nothing was imported: nothing changed" in body
    assert "v1 is this file already; no draft was made." in body
    assert not workflow.versions.filter(status="draft").exists()


def test_the_diff_page_shows_changes_field_by_field(operator: User, workflow: Workflow) -> None:
    services.step_save(
        workflow_id=workflow.pk,
        user=operator,
        index=0,
        data={"id": "open-login", "type": "goto", "url": "http://127.0.0.1:8001/login?lang=en"},
    )
    client = client_for(Role.REVIEWERS)

    body = client.get(f"/workflows/{workflow.slug}/diff/?from=1&to=draft").content.decode()

    assert "Step &#x27;open-login&#x27;" in body
    assert "http://127.0.0.1:8001/login?lang=en" in body


def test_credential_values_are_never_rendered(operator: User, acme_credential: Credential) -> None:
    client = Client()
    client.force_login(operator)

    listing = client.get("/workflows/credentials/").content.decode()
    refused = client.post(
        "/workflows/credentials/new/",
        {
            "name": "acme-portal",
            "kind": "username_password",
            "username": "u",
            "password": "hunter2-secret",
        },
    ).content.decode()
    replace_page = client.get(
        f"/workflows/credentials/{acme_credential.pk}/replace/"
    ).content.decode()

    assert "acme-portal" in listing
    assert "portal-demo-2026" not in listing + replace_page
    assert "a credential named &#x27;acme-portal&#x27; exists" in refused
    assert "hunter2-secret" not in refused
    assert 'name="seed"' not in replace_page


def test_audit_events_carry_the_request_id_and_client_address(
    operator: User, workflow: Workflow
) -> None:
    client = Client(REMOTE_ADDR="127.0.0.7")
    client.force_login(operator)

    response = client.post(
        f"/workflows/{workflow.slug}/archive/", {"archived": "1"}, HTTP_X_REQUEST_ID="req-42"
    )

    event = AuditEvent.objects.latest("sequence")
    assert response["X-Request-ID"] == "req-42"
    assert (event.action, event.request_id, event.client_ip) == (
        "workflow.archived",
        "req-42",
        "127.0.0.7",
    )
    assert event.actor == operator


def test_the_palette_offers_a_bounded_pause(operator: User, workflow: Workflow) -> None:
    client = Client()
    client.force_login(operator)
    assert (
        f"/workflows/{workflow.slug}/steps/add/?type=wait"
        in client.get(f"/workflows/{workflow.slug}/").content.decode()
    )
    url = f"/workflows/{workflow.slug}/steps/add/"

    too_long = client.post(
        url, {"type": "wait", "id": "pause", "seconds": "90", "timeout_ms": 10000},
        HTTP_HX_REQUEST="true",
    )  # fmt: skip
    saved = client.post(
        url, {"type": "wait", "id": "pause", "seconds": "3", "timeout_ms": 10000},
        HTTP_HX_REQUEST="true",
    )  # fmt: skip

    assert "a wait lasts more than 0 and at most 60 seconds (got 90)" in too_long.content.decode()
    assert "Wait 3 seconds" in saved.content.decode()
    draft = workflow.versions.get(status="draft")
    assert draft.steps[-1] == {"id": "pause", "type": "wait", "seconds": 3.0}


def test_the_editor_keeps_a_money_parameters_decimal_comma(
    operator: User, workflow: Workflow
) -> None:
    client = Client()
    client.force_login(operator)
    amount = {"name": "amount", "type": "money", "currency": "EUR", "required": "on"}

    client.post(f"/workflows/{workflow.slug}/parameters/1/edit/", {**amount, "decimal_comma": "on"})
    with_comma = workflow.versions.get(status="draft").parameters[1]
    client.post(f"/workflows/{workflow.slug}/parameters/1/edit/", amount)
    without = workflow.versions.get(status="draft").parameters[1]

    stored = {"name": "amount", "type": "money", "currency": "EUR"}  # required is the default
    assert with_comma == {**stored, "decimal_comma": True}
    assert without == stored


def test_the_settings_form_sets_reminders_and_escalation_for_the_next_version(
    operator: User, workflow: Workflow
) -> None:
    client = Client()
    client.force_login(operator)
    form = {
        "name": workflow.name,
        "description": workflow.description,
        "reviewer_group": workflow.reviewer_group_id,
        "allowed_hosts": "\n".join(workflow.allowed_hosts),
        "step_budget": workflow.step_budget,
        "run_ttl_minutes": workflow.run_ttl_minutes,
        "approval_quorum": 1,
        "approval_expiry_minutes": 60,
        "credentials": [c.pk for c in workflow.credentials.all()],
        "max_concurrent_runs": workflow.max_concurrent_runs,
        "approval_passkey": "never",
        "filmstrip_seconds_per_frame": 2,
        "filmstrip_max_mb": 20,
        # As the form shows them: the example's decision facts.
        "approval_fact_payee": "iban",
        "approval_fact_reference": "invoice",
    }
    refused = client.post(
        f"/workflows/{workflow.slug}/settings/",
        {**form, "approval_remind_before_minutes": 0, "approval_escalate_after_minutes": 20},
    )
    assert (
        "“Escalate an undecided request after (minutes)” needs an “Escalation group” to "
        "escalate to" in refused.content.decode()
    )
    workflow.refresh_from_db()
    assert workflow.approval_escalate_after_minutes == 0

    saved = client.post(
        f"/workflows/{workflow.slug}/settings/",
        {
            **form,
            "approval_remind_before_minutes": 10,
            "approval_escalate_after_minutes": 20,
            "approval_escalation_group": "Admins",
        },
    )
    assert saved.status_code == 302
    workflow.refresh_from_db()
    assert workflow.approval_remind_before_minutes == 10
    assert workflow.approval_escalation_group == "Admins"
    services.workflow_publish(workflow_id=workflow.pk, user=operator, message="v2")
    document = workflow.versions.get(number=2).document
    assert document is not None
    policy = document["settings"]["approval"]
    # Stored without the defaults, like every setting: what approvals.services reads.
    assert policy == {
        "remind_before_minutes": 10,
        "escalate_after_minutes": 20,
        "escalation_group": "Admins",
        "facts": {"payee": "iban", "reference": "invoice"},
    }
    # A version without them carries none of the new keys: its exports do not change.
    assert "remind_before_minutes" not in str(workflow.versions.get(number=1).document)


def test_the_palette_offers_asking_a_person(operator: User, workflow: Workflow) -> None:
    client = Client()
    client.force_login(operator)
    assert (
        f"/workflows/{workflow.slug}/steps/add/?type=ask"
        in client.get(f"/workflows/{workflow.slug}/").content.decode()
    )
    url = f"/workflows/{workflow.slug}/steps/add/"
    form = client.get(f"{url}?type=ask").content.decode()
    assert "Who answers" in form
    assert "Irreversible" not in form  # asking changes nothing on the portal

    one_option = client.post(
        url, {"type": "ask", "id": "which", "question": "Which supplier?", "answer": "choice",
              "options_text": "Nordwind GmbH", "save_as": "supplier", "answered_by": "launcher",
              "timeout_minutes": "30", "timeout_ms": 10000},
        HTTP_HX_REQUEST="true",
    )  # fmt: skip
    saved = client.post(
        url, {"type": "ask", "id": "which", "question": "Which supplier?", "answer": "choice",
              "options_text": "Nordwind GmbH\n\nNordwind Logistik GmbH\n", "save_as": "supplier",
              "answered_by": "Treasury", "timeout_minutes": "30", "timeout_ms": 10000},
        HTTP_HX_REQUEST="true",
    )  # fmt: skip

    assert "a choice needs at least two options to choose from" in one_option.content.decode()
    assert "Ask Treasury: &#x27;Which supplier?&#x27;" in saved.content.decode()
    draft = workflow.versions.get(status="draft")
    assert draft.steps[-1] == {
        "id": "which", "type": "ask", "question": "Which supplier?", "answer": "choice",
        "options": ["Nordwind GmbH", "Nordwind Logistik GmbH"], "save_as": "supplier",
        "answered_by": "Treasury", "timeout_minutes": 30,
    }  # fmt: skip


def settings_post(workflow: Workflow, **changes: object) -> dict[str, object]:
    """The settings form as it comes filled in for ``workflow``, with ``changes``."""
    initial = WorkflowSettingsForm.initial_from(workflow)
    initial["credentials"] = [c.pk for c in initial["credentials"]]
    return {
        k: v
        for k, v in {**initial, **changes}.items()
        if v is not None and v is not False and k != "offer_as_tool"
    }


def test_saved_settings_wait_in_the_draft_and_the_page_says_old_and_new(
    operator: User, workflow: Workflow
) -> None:
    client = Client()
    client.force_login(operator)

    saved = client.post(
        f"/workflows/{workflow.slug}/settings/",
        settings_post(workflow, approval_expiry_minutes=30, approval_remind_before_minutes=10),
        follow=True,
    )

    page = saved.content.decode()
    assert "Settings saved in the draft" in page
    assert "Unpublished changes." in page
    assert "Publish version 2" in page
    assert "Runs use the settings of v1." in page
    assert '<dd>60 min <span class="draft-change">→ draft: 30 min</span>' in page
    assert "→ draft: 10 min before expiry" in page
    assert workflow.versions.get(number=1).settings_model.approval.expiry_minutes == 60


def test_the_form_sets_slack_the_passkey_and_the_filmstrip_with_errors_in_its_words(
    operator: User, workflow: Workflow
) -> None:
    client = Client()
    client.force_login(operator)
    url = f"/workflows/{workflow.slug}/settings/"

    wrong_channel = client.post(
        url, settings_post(workflow, approval_slack_channel="#Pay Ments")
    ).content.decode()
    no_amount = client.post(url, settings_post(workflow, approval_passkey="above")).content.decode()
    assert "is not a Slack channel: give its id (C0123ABCD)" in wrong_channel
    assert "“above an amount” needs “Passkey above the amount”, e.g. 1000.00" in no_amount
    workflow.refresh_from_db()
    assert workflow.approval_reach == {"facts": {"payee": "iban", "reference": "invoice"}}

    client.post(
        url,
        settings_post(
            workflow,
            approval_slack_channel="#payments",
            approval_passkey="above",
            approval_passkey_above_amount="1000.00",
            filmstrip="on",
            filmstrip_seconds_per_frame=1,
            filmstrip_max_mb=5,
        ),
    )
    services.workflow_publish(workflow_id=workflow.pk, user=operator, message="v2")

    settings = workflow.versions.get(number=2).settings_model
    assert settings.approval.slack_channel == "#payments"
    assert (settings.approval.passkey, str(settings.approval.passkey_above_amount)) == (
        "above",
        "1000.00",
    )
    assert (
        settings.filmstrip,
        settings.filmstrip_seconds_per_frame,
        settings.filmstrip_max_mb,
    ) == (
        True,
        1,
        5,
    )
    form = client.get(url).content.decode()
    assert 'value="#payments"' in form
    assert 'value="1000.00"' in form


def test_the_settings_form_shows_and_sets_the_decision_facts(
    operator: User, workflow: Workflow
) -> None:
    client = Client()
    client.force_login(operator)
    page = client.get(f"/workflows/{workflow.slug}/settings/")
    form = page.context["form"]
    assert form.initial["approval_fact_payee"] == "iban"
    assert form.initial["approval_fact_reference"] == "invoice"
    data = settings_post(workflow)

    refused = client.post(
        f"/workflows/{workflow.slug}/settings/", {**data, "approval_fact_payee": "The IBAN"}
    )
    assert refused.context["form"].errors["approval_fact_payee"] == [
        "'The IBAN' is not the name of a parameter or output (lowercase letters, digits and _, "
        "like payee_iban)"
    ]

    saved = client.post(
        f"/workflows/{workflow.slug}/settings/", {**data, "approval_fact_amount": "amount"}
    )
    assert saved.status_code == 302
    workflow.refresh_from_db()
    assert workflow.approval_reach["facts"] == {
        "amount": "amount",
        "payee": "iban",
        "reference": "invoice",
    }
