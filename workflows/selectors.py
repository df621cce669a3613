from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Max, Q, QuerySet
from django.http import Http404

from sessions.engine.steps.base import StepBase
from sessions.engine.steps.language import Target
from workflows.models import Credential, Workflow, WorkflowVersion
from workflows.schema import STEP_ADAPTER, describe_step


def workflow_list(*, search: str = "", archived: bool = False) -> QuerySet[Workflow]:
    workflows = Workflow.objects.filter(archived=archived).select_related("owner")
    if search:
        workflows = workflows.filter(
            Q(name__icontains=search) | Q(slug__icontains=search) | Q(description__icontains=search)
        )
    return workflows.annotate(
        published_count=Count("versions", filter=Q(versions__status="published")),
        latest_number=Max("versions__number"),
    ).order_by("name")


def workflow_get(slug: str) -> Workflow:
    """The workflow with ``slug`` or 404. Every role that may open workflows may read every one."""
    try:
        return Workflow.objects.select_related("owner", "reviewer_group").get(slug=slug)
    except Workflow.DoesNotExist:
        raise Http404("no such workflow") from None


def version_get(workflow: Workflow, number: int) -> WorkflowVersion:
    try:
        return workflow.versions.select_related("author").get(
            number=number, status=WorkflowVersion.Status.PUBLISHED
        )
    except WorkflowVersion.DoesNotExist:
        raise Http404("no such version") from None


def draft_of(workflow: Workflow) -> WorkflowVersion | None:
    return workflow.versions.filter(status=WorkflowVersion.Status.DRAFT).first()


def working_copy(workflow: Workflow) -> WorkflowVersion | None:
    """What the editor shows: the draft, or the latest published version when there is no draft
    (the first edit then starts a draft from it)."""
    return draft_of(workflow) or published_versions(workflow).first()


def published_versions(workflow: Workflow) -> QuerySet[WorkflowVersion]:
    return (
        workflow.versions.filter(status=WorkflowVersion.Status.PUBLISHED)
        .select_related("author")
        .order_by("-number")
    )


@dataclass(frozen=True)
class StepView:
    index: int
    data: dict[str, Any]
    sentence: str
    valid: bool

    @property
    def id(self) -> str:
        return str(self.data.get("id", "?"))


def step_views(steps: list[dict[str, Any]]) -> list[StepView]:
    views = []
    for index, data in enumerate(steps):
        try:
            step = STEP_ADAPTER.validate_python(data)
            assert isinstance(step, StepBase)
            views.append(StepView(index=index, data=data, sentence=describe_step(step), valid=True))
        except ValueError:
            views.append(
                StepView(
                    index=index, data=data, sentence=f"{data.get('type')} (invalid)", valid=False
                )
            )
    return views


@dataclass(frozen=True)
class SessionCheckView:
    """A draft's logged-in check in words; '' for what is not set yet."""

    check_url: str
    logged_in: str
    rebake_every_hours: int


def session_check_view(session: dict[str, Any]) -> SessionCheckView:
    logged_in = ""
    if session.get("logged_in"):
        try:
            logged_in = Target.model_validate(session["logged_in"]).describe()
        except ValueError:
            logged_in = str(session["logged_in"])
    return SessionCheckView(
        check_url=str(session.get("check_url") or ""),
        logged_in=logged_in,
        rebake_every_hours=int(session.get("rebake_every_hours") or 12),
    )


def credential_list() -> QuerySet[Credential]:
    return (
        Credential.objects.select_related("created_by")
        .prefetch_related("workflows")
        .order_by("name")
    )
