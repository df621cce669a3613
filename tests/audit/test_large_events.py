"""The trail's largest events: a launch with every parameter at its longest still exports and
verifies (the CSV reader's field limit must not break verification), and longer values are
refused before anything is written."""

from __future__ import annotations

import csv
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User

from pandaweb.audit.export import verify_export
from pandaweb.audit.exports import AuditFilter, audit_export_to_file
from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from sessions import services
from sessions.models import Run
from tests.factories import user_with_role
from tests.sessions.conftest import no_background_runs, operator, publish
from workflows.models import Workflow
from workflows.schema import STRING_MAX_LENGTH_CAP, STRING_MAX_LENGTH_DEFAULT

__all__ = ["no_background_runs", "operator"]

pytestmark = pytest.mark.django_db

# As many parameters as a workflow may have, each as long as a string parameter may be.
PARAMETERS = 50


@pytest.fixture(autouse=True)
def default_csv_field_limit() -> Iterator[None]:
    """Every test starts from the reader's default limit (it is per process)."""
    before = csv.field_size_limit()
    csv.field_size_limit(131_072)
    yield
    csv.field_size_limit(before)


@pytest.fixture
def widest_workflow(operator: User) -> Workflow:
    parameters = [
        {"name": f"p{i}", "type": "string", "max_length": STRING_MAX_LENGTH_CAP}
        for i in range(PARAMETERS)
    ]
    return publish(
        operator,
        {
            "name": "Widest",
            "slug": "widest",
            "settings": {"allowed_hosts": ["127.0.0.1:8001"]},
            "parameters": parameters,
            "steps": [{"id": "open", "type": "goto", "url": "http://127.0.0.1:8001/"}],
        },
    )


def test_the_largest_launch_event_exports_and_verifies(
    operator: User, widest_workflow: Workflow
) -> None:
    inputs = {f"p{i}": "€" * STRING_MAX_LENGTH_CAP for i in range(PARAMETERS)}
    run = services.run_launch(workflow_id=widest_workflow.pk, user=operator, raw_inputs=inputs)
    event = AuditEvent.objects.get(action="run.launched", object_id=str(run.pk))
    assert len(str(event.after)) > 50 * STRING_MAX_LENGTH_CAP
    compliance = user_with_role(Role.COMPLIANCE)

    path = audit_export_to_file(user=compliance, filters=AuditFilter())
    try:
        check = verify_export(path)
    finally:
        path.unlink()

    assert check.ok, check.reason
    assert check.count == AuditEvent.objects.count() - 1  # all but the export's own event


def test_a_value_over_the_default_maximum_is_refused_before_anything_is_written(
    operator: User, widest_workflow: Workflow
) -> None:
    iban = publish(
        operator,
        {
            "name": "Pay",
            "slug": "pay",
            "settings": {"allowed_hosts": ["127.0.0.1:8001"]},
            "parameters": [{"name": "iban", "type": "string"}],
            "steps": [{"id": "open", "type": "goto", "url": "http://127.0.0.1:8001/"}],
        },
    )
    events = AuditEvent.objects.count()

    with pytest.raises(services.RunError) as refused:
        services.run_launch(
            workflow_id=iban.pk, user=operator, raw_inputs={"iban": "DE" + "9" * 1_000_000}
        )

    assert refused.value.field_errors == {
        "iban": [f"must be at most {STRING_MAX_LENGTH_DEFAULT} characters"]
    }
    assert not Run.objects.exists()
    assert AuditEvent.objects.count() == events
