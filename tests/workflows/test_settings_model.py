from __future__ import annotations

from workflows.models import WorkflowVersion
from workflows.schema import ApprovalPolicy, WorkflowSettings


def test_it_reads_omitted_settings_as_the_schema_defaults() -> None:
    version = WorkflowVersion(document={"settings": {"allowed_hosts": ["127.0.0.1:8000"]}})

    typed = version.settings_model

    assert isinstance(typed, WorkflowSettings)
    assert typed.run_ttl_minutes == WorkflowSettings.model_fields["run_ttl_minutes"].default
    assert typed.step_budget == WorkflowSettings.model_fields["step_budget"].default
    assert typed.approval == ApprovalPolicy()


def test_it_reads_what_the_document_says() -> None:
    version = WorkflowVersion(
        document={
            "settings": {
                "allowed_hosts": ["127.0.0.1:8000"],
                "run_ttl_minutes": 7,
                "step_budget": 9,
                "approval": {"quorum": 2, "expiry_minutes": 30, "author_may_approve": True},
            }
        }
    )

    typed = version.settings_model

    assert (typed.run_ttl_minutes, typed.step_budget) == (7, 9)
    assert (typed.approval.quorum, typed.approval.expiry_minutes) == (2, 30)
    assert typed.approval.author_may_approve is True
