from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction

from pandaweb.audit.models import AuditEvent
from tests.workflows.conftest import EXAMPLE
from workflows import services
from workflows.fileformat import dump_document, load_document
from workflows.models import Credential, Workflow, WorkflowVersion

pytestmark = pytest.mark.django_db

GOTO = {"id": "open", "type": "goto", "url": "http://127.0.0.1:8001/login"}
PAY = {"id": "pay", "type": "click", "target": {"role": "button", "name": "Submit payment"}}


def new_workflow(user: User, **kwargs: Any) -> Workflow:
    return services.workflow_create(
        user=user, name="Pay", slug="pay", allowed_hosts=["127.0.0.1:8001"], **kwargs
    )


def one_event(action: str, call: Callable[[], Any]) -> Any:
    """Run ``call`` and check it wrote exactly one audit event, of ``action``."""
    before = AuditEvent.objects.count()
    result = call()
    events = list(AuditEvent.objects.order_by("sequence")[before:])
    assert [e.action for e in events] == [action]
    return result


def test_creating_a_workflow_makes_an_empty_draft_and_one_event(operator: User) -> None:
    workflow = one_event("workflow.created", lambda: new_workflow(operator))

    assert workflow.versions.get().status == WorkflowVersion.Status.DRAFT
    assert workflow.allowed_hosts == ["127.0.0.1:8001"]
    assert workflow.reviewer_group.name == "Reviewers"


def test_it_refuses_a_taken_or_reserved_slug(operator: User) -> None:
    new_workflow(operator)

    with pytest.raises(services.WorkflowError) as taken:
        new_workflow(operator)
    with pytest.raises(services.WorkflowError) as reserved:
        services.workflow_create(user=operator, name="x", slug="import")

    assert taken.value.field_errors == {"slug": ["a workflow with the slug 'pay' exists"]}
    assert "reserved" in reserved.value.field_errors["slug"][0]


def test_steps_are_added_changed_moved_duplicated_and_deleted(operator: User) -> None:
    workflow = new_workflow(operator)
    pk = workflow.pk

    one_event(
        "workflow.step_added", lambda: services.step_save(workflow_id=pk, user=operator, data=GOTO)
    )
    one_event(
        "workflow.step_added", lambda: services.step_save(workflow_id=pk, user=operator, data=PAY)
    )
    one_event(
        "workflow.step_changed",
        lambda: services.step_save(
            workflow_id=pk, user=operator, index=1, data={**PAY, "irreversible": True}
        ),
    )
    one_event(
        "workflow.step_added",
        lambda: services.step_duplicate(workflow_id=pk, user=operator, index=1, step_id="pay"),
    )
    one_event(
        "workflow.step_moved",
        lambda: services.step_move(
            workflow_id=pk, user=operator, index=2, step_id="pay-copy", to_index=0
        ),
    )
    draft = one_event(
        "workflow.step_deleted",
        lambda: services.step_delete(workflow_id=pk, user=operator, index=2, step_id="pay"),
    )

    draft.refresh_from_db()
    assert [s["id"] for s in draft.steps] == ["pay-copy", "open"]
    assert draft.steps[0]["irreversible"] is True


def test_a_stale_page_cannot_delete_a_different_step(operator: User) -> None:
    workflow = new_workflow(operator)
    services.step_save(workflow_id=workflow.pk, user=operator, data=GOTO)
    services.step_save(workflow_id=workflow.pk, user=operator, data=PAY)
    services.step_move(workflow_id=workflow.pk, user=operator, index=1, step_id="pay", to_index=0)

    with pytest.raises(services.WorkflowError, match="changed since this page was loaded"):
        services.step_delete(workflow_id=workflow.pk, user=operator, index=1, step_id="pay")

    assert [s["id"] for s in workflow.versions.get().steps] == ["pay", "open"]


def test_an_invalid_step_is_refused_field_by_field(operator: User) -> None:
    workflow = new_workflow(operator)

    with pytest.raises(services.WorkflowError) as refused:
        services.step_save(
            workflow_id=workflow.pk,
            user=operator,
            data={"id": "Bad Id", "type": "click", "target": {"role": "buton"}},
        )

    assert set(refused.value.field_errors) == {"id", "target"}
    assert workflow.versions.get().steps == []
    assert not AuditEvent.objects.filter(action="workflow.step_added").exists()


def test_publishing_refuses_problems_and_needs_warnings_accepted(operator: User) -> None:
    workflow = new_workflow(operator)
    services.step_save(
        workflow_id=workflow.pk, user=operator, data={**GOTO, "url": "http://evil.example.test/"}
    )
    with pytest.raises(services.PublishRefused) as refused:
        services.workflow_publish(workflow_id=workflow.pk, user=operator, message="first")
    assert refused.value.problems == [
        "step 1 'open', field url: evil.example.test is not in the allowed hosts (127.0.0.1:8001)"
    ]

    services.step_save(workflow_id=workflow.pk, user=operator, index=0, data=GOTO)
    services.step_save(workflow_id=workflow.pk, user=operator, data=PAY)
    with pytest.raises(services.PublishRefused) as warned:
        services.workflow_publish(workflow_id=workflow.pk, user=operator, message="first")
    assert warned.value.problems == []
    assert "reads like 'Submit'" in warned.value.warnings[0]

    version = one_event(
        "workflow.published",
        lambda: services.workflow_publish(
            workflow_id=workflow.pk, user=operator, message="first", accept_warnings=True
        ),
    )

    assert (version.number, version.status, version.author) == (1, "published", operator)
    assert version.document["steps"] == [GOTO, PAY]
    assert version.document["settings"]["allowed_hosts"] == ["127.0.0.1:8001"]
    assert len(version.content_hash) == 64


def test_editing_after_publishing_starts_a_new_draft_and_keeps_the_version(operator: User) -> None:
    workflow = new_workflow(operator)
    services.step_save(workflow_id=workflow.pk, user=operator, data=GOTO)
    v1 = services.workflow_publish(workflow_id=workflow.pk, user=operator, message="first")

    services.step_save(workflow_id=workflow.pk, user=operator, data={**GOTO, "id": "again"})
    services.workflow_update_settings(
        workflow_id=workflow.pk,
        user=operator,
        name="Pay",
        description="",
        reviewer_group=workflow.reviewer_group,
        allowed_hosts=["127.0.0.1:8001", "*.acme.example"],
        step_budget=10,
        run_ttl_minutes=5,
        approval_quorum=2,
        approval_expiry_minutes=30,
        author_may_approve=False,
        credentials=[],
    )
    v2 = services.workflow_publish(workflow_id=workflow.pk, user=operator, message="second")

    v1.refresh_from_db()
    assert v1.document is not None
    assert v2.document is not None
    assert v1.document["steps"] == [GOTO]
    assert v1.document["settings"]["allowed_hosts"] == ["127.0.0.1:8001"]
    assert v2.number == 2
    assert v2.document["settings"]["approval"] == {"quorum": 2, "expiry_minutes": 30}
    assert [s["id"] for s in v2.document["steps"]] == ["open", "again"]


def test_the_database_refuses_to_change_or_delete_a_published_version(operator: User) -> None:
    workflow = new_workflow(operator)
    services.step_save(workflow_id=workflow.pk, user=operator, data=GOTO)
    version = services.workflow_publish(workflow_id=workflow.pk, user=operator, message="first")

    for statement in (
        "UPDATE workflows_workflowversion SET message = 'edited' WHERE id = %s",
        "DELETE FROM workflows_workflowversion WHERE id = %s",
    ):
        with (
            pytest.raises(IntegrityError, match="immutable"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(statement, [version.pk])

    version.refresh_from_db()
    assert version.message == "first"


def test_an_archived_workflow_cannot_be_edited(operator: User) -> None:
    workflow = new_workflow(operator)
    one_event(
        "workflow.archived",
        lambda: services.workflow_set_archived(
            workflow_id=workflow.pk, user=operator, archived=True
        ),
    )

    with pytest.raises(services.WorkflowError, match="archived"):
        services.step_save(workflow_id=workflow.pk, user=operator, data=GOTO)


def test_importing_the_demo_file_makes_a_publishable_draft(
    operator: User, acme_credential: Credential
) -> None:
    workflow = one_event(
        "workflow.imported",
        lambda: services.workflow_import(user=operator, text=EXAMPLE.read_bytes()),
    )

    assert workflow.slug == "acme-pay-invoice"
    assert list(workflow.credentials.all()) == [acme_credential]
    version = services.workflow_publish(workflow_id=workflow.pk, user=operator, message="imported")
    _, exported = services.version_export(version_id=version.pk, user=operator, fmt="yaml")
    assert exported == dump_document(load_document(EXAMPLE.read_text()))


def test_import_refuses_unknown_credentials_and_saves_nothing(operator: User) -> None:
    workflows, versions, events = (
        Workflow.objects.count(),
        WorkflowVersion.objects.count(),
        AuditEvent.objects.count(),
    )

    with pytest.raises(services.ImportRefused) as refused:
        services.workflow_import(user=operator, text=EXAMPLE.read_bytes())

    messages = [str(p) for p in refused.value.problems]
    line = EXAMPLE.read_text().splitlines().index("  - acme-portal") + 1
    assert (
        messages[0]
        == f"line {line}, settings.credentials.0: there is no credential named 'acme-portal'"
    )
    assert (
        Workflow.objects.count(),
        WorkflowVersion.objects.count(),
        AuditEvent.objects.count(),
    ) == (workflows, versions, events)


def test_import_names_the_step_and_line_of_a_goto_outside_the_hosts(
    operator: User, acme_credential: Credential
) -> None:
    text = EXAMPLE.read_text().replace(
        "url: http://127.0.0.1:8001/login", "url: http://169.254.169.254/"
    )
    line = text.splitlines().index("  url: http://169.254.169.254/") + 1

    with pytest.raises(services.ImportRefused) as refused:
        services.workflow_import(user=operator, text=text)

    assert [str(p) for p in refused.value.problems] == [
        f"line {line}, step 1 'open-login', field url: 169.254.169.254 is not in the allowed hosts "
        "(127.0.0.1:8001)"
    ]
    assert not Workflow.objects.exists()


def test_importing_over_an_existing_slug_replaces_only_its_draft(
    operator: User, acme_credential: Credential
) -> None:
    workflow = services.workflow_import(user=operator, text=EXAMPLE.read_bytes())
    v1 = services.workflow_publish(workflow_id=workflow.pk, user=operator, message="v1")
    changed = EXAMPLE.read_text().replace("step_budget: 40", "step_budget: 30")

    services.workflow_import(user=operator, text=changed)

    workflow.refresh_from_db()
    assert workflow.step_budget == 30
    assert workflow.versions.count() == 2
    v1.refresh_from_db()
    assert v1.document is not None
    assert v1.document["settings"]["step_budget"] == 40


def test_importing_the_latest_version_again_says_nothing_changed_and_makes_no_draft(
    operator: User, acme_credential: Credential
) -> None:
    workflow = services.workflow_import(user=operator, text=EXAMPLE.read_bytes())
    services.workflow_publish(workflow_id=workflow.pk, user=operator, message="v1")
    # The same content, written differently: key order, a default spelled out, comments.
    text = "# exported again\n" + EXAMPLE.read_text()
    events = AuditEvent.objects.count()

    with pytest.raises(services.ImportUnchanged) as unchanged:
        services.workflow_import(user=operator, text=text)

    assert str(unchanged.value) == (
        "nothing changed: 'Pay an Acme invoice' v1 is this file already"
    )
    assert list(workflow.versions.values_list("status", flat=True)) == ["published"]
    assert AuditEvent.objects.count() == events


def test_importing_the_latest_version_restores_settings_changed_since(
    operator: User, acme_credential: Credential
) -> None:
    workflow = services.workflow_import(user=operator, text=EXAMPLE.read_bytes())
    services.workflow_publish(workflow_id=workflow.pk, user=operator, message="v1")
    Workflow.objects.filter(pk=workflow.pk).update(step_budget=12)

    services.workflow_import(user=operator, text=EXAMPLE.read_bytes())

    workflow.refresh_from_db()
    assert workflow.step_budget == 40
    assert workflow.versions.filter(status="draft").exists()


def test_credentials_are_encrypted_at_rest(acme_credential: Credential) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM workflows_credential")
        dump = repr(cursor.fetchall())
    events = repr(list(AuditEvent.objects.values()))

    assert "portal-demo-2026" not in dump
    assert "acme-demo" not in dump
    assert "portal-demo-2026" not in events
    assert services.vault().open(acme_credential.ciphertext) == {
        "username": "acme-demo",
        "password": "portal-demo-2026",
    }


def test_rotating_keys_keeps_every_secret_readable(
    acme_credential: Credential, operator: User, settings: Any
) -> None:
    from workflows.vault import Vault, VaultError, generate_key

    old_key = settings.CREDENTIAL_KEYS[0]
    services.credential_create(
        user=operator, name="api", kind="api_token", description="", values={"token": "t0k3n"}
    )
    new_key = generate_key()
    settings.CREDENTIAL_KEYS = [new_key, old_key]

    assert (
        one_event("credential.keys_rotated", lambda: services.credentials_reencrypt(actor=operator))
        == 2
    )

    settings.CREDENTIAL_KEYS = [new_key]
    secrets = {c.name: services.vault().open(c.ciphertext) for c in Credential.objects.all()}
    assert secrets == {
        "acme-portal": {"username": "acme-demo", "password": "portal-demo-2026"},
        "api": {"token": "t0k3n"},
    }
    with pytest.raises(VaultError, match="could not be decrypted"):
        Vault([old_key]).open(Credential.objects.get(name="api").ciphertext)


def test_a_credential_value_is_checked_for_its_kind_without_echoing_it(operator: User) -> None:
    with pytest.raises(services.WorkflowError) as refused:
        services.credential_create(
            user=operator, name="otp", kind="totp", description="", values={"seed": "not base32 !!"}
        )

    assert refused.value.field_errors == {"seed": ["not a base32 TOTP seed (letters A–Z, 2–7)"]}
    assert "not base32" not in repr(refused.value.field_errors)
    assert not Credential.objects.exists()


def test_replacing_a_value_writes_one_event_without_the_value(
    acme_credential: Credential, operator: User
) -> None:
    one_event(
        "credential.value_replaced",
        lambda: services.credential_replace_value(
            credential_id=acme_credential.pk,
            user=operator,
            values={"username": "acme-demo", "password": "new-secret-value"},
        ),
    )

    acme_credential.refresh_from_db()
    assert services.vault().open(acme_credential.ciphertext)["password"] == "new-secret-value"
    assert "new-secret-value" not in repr(list(AuditEvent.objects.values()))


def test_the_reencrypt_command_fails_whole_when_a_key_is_missing(
    acme_credential: Credential, settings: Any
) -> None:
    from django.core.management import CommandError, call_command

    from workflows.vault import generate_key

    original = acme_credential.ciphertext
    settings.CREDENTIAL_KEYS = [generate_key()]

    with pytest.raises(CommandError, match="nothing was changed: a credential could not be"):
        call_command("credentials_reencrypt")

    acme_credential.refresh_from_db()
    assert acme_credential.ciphertext == original


def settings_form(workflow: Workflow, **changes: Any) -> dict[str, Any]:
    """Every argument of the settings form as the workflow has it now, with ``changes``."""
    return {
        "name": workflow.name,
        "description": workflow.description,
        "reviewer_group": workflow.reviewer_group,
        "allowed_hosts": list(workflow.allowed_hosts),
        "step_budget": workflow.step_budget,
        "run_ttl_minutes": workflow.run_ttl_minutes,
        "approval_quorum": workflow.approval_quorum,
        "approval_expiry_minutes": workflow.approval_expiry_minutes,
        "author_may_approve": workflow.author_may_approve,
        "approval_remind_before_minutes": workflow.approval_remind_before_minutes,
        "approval_escalate_after_minutes": workflow.approval_escalate_after_minutes,
        "approval_escalation_group": workflow.approval_escalation_group,
        "credentials": list(workflow.credentials.all()),
        **changes,
    }


def test_changing_the_settings_of_a_published_workflow_starts_a_draft_to_publish(
    operator: User,
) -> None:
    workflow = new_workflow(operator)
    services.step_save(workflow_id=workflow.pk, user=operator, data=GOTO)
    v1 = services.workflow_publish(workflow_id=workflow.pk, user=operator, message="first")

    one_event(
        "workflow.settings_changed",
        lambda: services.workflow_update_settings(
            workflow_id=workflow.pk,
            user=operator,
            **settings_form(
                workflow, approval_expiry_minutes=30, approval_remind_before_minutes=10
            ),
        ),
    )

    draft = workflow.versions.get(status=WorkflowVersion.Status.DRAFT)
    assert draft.steps == v1.steps
    assert services.draft_review(workflow, draft).problems == []
    # Runs keep the published version's policy until the draft is published.
    assert v1.settings_model.approval.expiry_minutes == 60
    v2 = services.workflow_publish(workflow_id=workflow.pk, user=operator, message="sooner")
    assert (
        v2.settings_model.approval.expiry_minutes,
        v2.settings_model.approval.remind_before_minutes,
    ) == (30, 10)

    # Saving them again unchanged is no change of the document: no draft to publish.
    workflow.refresh_from_db()
    services.workflow_update_settings(
        workflow_id=workflow.pk, user=operator, **settings_form(workflow)
    )
    assert not workflow.versions.filter(status=WorkflowVersion.Status.DRAFT).exists()
