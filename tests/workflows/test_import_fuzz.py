from __future__ import annotations

import pytest
import yaml
from django.contrib.auth.models import User
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pandaweb.audit.models import AuditEvent
from tests.workflows.conftest import EXAMPLE
from workflows import services
from workflows.models import Credential, Workflow, WorkflowVersion

pytestmark = pytest.mark.django_db

BASE = yaml.safe_load(EXAMPLE.read_text())
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 10**6),
    st.text(max_size=20),
    st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    step_index=st.integers(0, len(BASE["steps"]) - 1),
    key=st.sampled_from(
        [
            "id",
            "type",
            "target",
            "url",
            "value",
            "fields",
            "checks",
            "irreversible",
            "credential",
            "x",
        ]
    ),
    value=junk,
)
def test_a_mutated_file_is_imported_whole_or_not_at_all(
    operator: User, acme_credential: Credential, step_index: int, key: str, value: object
) -> None:
    document = yaml.safe_load(EXAMPLE.read_text())
    document["steps"][step_index][key] = value
    counts = (Workflow.objects.count(), WorkflowVersion.objects.count(), AuditEvent.objects.count())

    try:
        workflow = services.workflow_import(user=operator, text=yaml.safe_dump(document))
    except services.ImportRefused as refused:
        assert refused.problems
        assert all(str(problem) for problem in refused.problems)
        after = (
            Workflow.objects.count(),
            WorkflowVersion.objects.count(),
            AuditEvent.objects.count(),
        )
        assert after == counts
    else:
        draft = workflow.versions.get(status="draft")
        assert len(draft.steps) == len(document["steps"])


def test_a_null_character_anywhere_is_refused_where_it_is(
    operator: User, acme_credential: Credential
) -> None:
    """PostgreSQL cannot store U+0000: found by the fuzz above as a failed save, not a refusal."""
    document = yaml.safe_load(EXAMPLE.read_text())
    document["steps"][3]["value"] = "12\x0050"
    document["description"] = "pay\x00"

    with pytest.raises(services.ImportRefused) as refused:
        services.workflow_import(user=operator, text=yaml.safe_dump(document))

    messages = [str(problem) for problem in refused.value.problems]
    assert len(messages) == 2
    assert all("null characters are not allowed" in message for message in messages)
    assert all(problem.line for problem in refused.value.problems)
    assert not Workflow.objects.exists()
