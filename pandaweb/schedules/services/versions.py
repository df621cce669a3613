"""The workflow version schedules and batches launch: the latest published one."""

from __future__ import annotations

from workflows.models import Workflow, WorkflowVersion
from workflows.schema import Parameter


def published_version(workflow: Workflow) -> WorkflowVersion | None:
    return (
        workflow.versions.filter(status=WorkflowVersion.Status.PUBLISHED)
        .order_by("-number")
        .first()
    )


def parameters_of(version: WorkflowVersion) -> list[Parameter]:
    return [Parameter.model_validate(p) for p in (version.document or {}).get("parameters", [])]
