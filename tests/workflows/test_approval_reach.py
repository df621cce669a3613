"""The approval policy's chat and passkey options: validated in the file, carried into every
published version, kept when the settings form (which does not show them) is saved."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User

from tests.sessions.conftest import EXAMPLE, acme_credential, operator, publish
from workflows import services as workflow_services
from workflows.models import Workflow

__all__ = ["acme_credential", "operator"]


def document(**approval: Any) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    data["settings"]["approval"] = approval
    return data


@pytest.mark.django_db
def test_it_refuses_a_passkey_threshold_without_an_amount(
    operator: User, acme_credential: Any
) -> None:
    for approval, message in [
        ({"passkey": "above"}, "needs passkey_above_amount"),
        ({"passkey": "always", "passkey_above_amount": "5.00"}, "only with passkey: above"),
        ({"slack_channel": "#Not A Channel"}, "is not a Slack channel: give its id (C0123ABCD)"),
    ]:
        text = yaml.safe_dump({"pandaweb": 1, **document(**approval)})
        with pytest.raises(workflow_services.ImportRefused) as refused:
            workflow_services.workflow_import(user=operator, text=text)
        assert message in str(refused.value.problems)
    assert not Workflow.objects.exists()


@pytest.mark.django_db
def test_the_options_reach_every_published_version_and_survive_the_settings_form(
    operator: User, acme_credential: Any
) -> None:
    workflow = publish(
        operator,
        document(slack_channel="C0PAYMENTS", passkey="above", passkey_above_amount="1000.00"),
    )
    expected = {
        "slack_channel": "C0PAYMENTS",
        "passkey": "above",
        "passkey_above_amount": "1000.00",
    }
    assert workflow.approval_reach == expected
    version = workflow.versions.get(number=1)
    assert version.document is not None
    assert version.document["settings"]["approval"].items() >= expected.items()

    workflow_services.workflow_update_settings(
        workflow_id=workflow.pk,
        user=operator,
        name=workflow.name,
        description=workflow.description,
        reviewer_group=workflow.reviewer_group,
        allowed_hosts=list(workflow.allowed_hosts),
        step_budget=workflow.step_budget,
        run_ttl_minutes=workflow.run_ttl_minutes,
        approval_quorum=2,
        approval_expiry_minutes=30,
        author_may_approve=False,
        credentials=list(workflow.credentials.all()),
    )
    workflow.refresh_from_db()
    assert workflow.approval_quorum == 2
    assert workflow.approval_reach == expected


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("facts", "message"),
    [
        ({"payee": "supplier"}, "there is no parameter or extracted output 'supplier'"),
        ({"amount": "invoice"}, "the amount must be a money or number parameter"),
        ({"amount": "amount", "currency": "USD"}, "is a money parameter in EUR"),
        ({"reference": "Invoice"}, "'Invoice' is not the name of a parameter or output"),
        ({"currency": "eur"}, "there is no parameter or extracted output 'eur'"),
        ({"amount": "receipt"}, "the amount must be extracted as money or a number"),
    ],
)
def test_it_refuses_decision_facts_that_name_nothing_the_run_has(
    operator: User, acme_credential: Any, facts: dict[str, str], message: str
) -> None:
    text = yaml.safe_dump({"pandaweb": 1, **document(facts=facts)})
    with pytest.raises(workflow_services.ImportRefused) as refused:
        workflow_services.workflow_import(user=operator, text=text)
    assert message in str(refused.value.problems)


@pytest.mark.django_db
def test_decision_facts_reach_the_version_and_its_runs(
    operator: User, acme_credential: Any
) -> None:
    facts = {"amount": "total", "currency": "EUR", "payee": "iban", "reference": "invoice"}
    workflow = publish(operator, document(facts=facts))
    version = workflow.versions.get(number=1)
    assert version.document is not None
    assert version.document["settings"]["approval"]["facts"] == facts
    assert [(s.fact, s.name, s.source, s.currency) for s in version.decision_fact_sources] == [
        ("amount", "total", "output", "EUR"),
        ("payee", "iban", "input", ""),
        ("reference", "invoice", "input", ""),
    ]


@pytest.mark.django_db
def test_without_declared_facts_the_money_parameter_is_the_amount(
    operator: User, acme_credential: Any
) -> None:
    version = publish(operator, document()).versions.get(number=1)
    assert [(s.fact, s.name, s.currency) for s in version.decision_fact_sources] == [
        ("amount", "amount", "EUR")
    ]
