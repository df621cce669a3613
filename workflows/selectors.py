from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Count, Max, Q, QuerySet
from django.http import Http404

from pandaweb.core.models import Team
from pandaweb.core.permissions import in_teams, teams_where
from pandaweb.core.roles import Capability
from sessions.engine.steps.base import StepBase
from sessions.engine.steps.language import Target
from workflows.models import Credential, Workflow, WorkflowVersion
from workflows.schema import STEP_ADAPTER, WorkflowSettings, describe_step

Person = AbstractBaseUser | AnonymousUser


def workflow_list(*, user: Person, search: str = "", archived: bool = False) -> QuerySet[Workflow]:
    """The workflows of the teams where ``user`` may see workflows."""
    workflows = in_teams(
        Workflow.objects.filter(archived=archived), user, Capability.VIEW_WORKFLOWS
    ).select_related("owner", "team")
    if search:
        workflows = workflows.filter(
            Q(name__icontains=search) | Q(slug__icontains=search) | Q(description__icontains=search)
        )
    return workflows.annotate(
        published_count=Count("versions", filter=Q(versions__status="published")),
        latest_number=Max("versions__number"),
    ).order_by("name")


def workflow_get(slug: str, *, user: Person) -> Workflow:
    """The workflow with ``slug`` or 404, also when it is another team's: its slug then tells
    ``user`` nothing. Whether they may change it is the services' question (AUTHOR_WORKFLOWS in
    its team)."""
    visible = in_teams(Workflow.objects.all(), user, Capability.VIEW_WORKFLOWS)
    try:
        return visible.select_related("owner", "reviewer_group", "team").get(slug=slug)
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


def credential_list(*, user: Person) -> QuerySet[Credential]:
    """The credentials of the teams where ``user`` may see workflows (never a value)."""
    return (
        in_teams(Credential.objects.all(), user, Capability.VIEW_WORKFLOWS)
        .select_related("created_by", "team")
        .prefetch_related("workflows")
        .order_by("name")
    )


def credential_get(*, user: Person, pk: int | None = None, name: str = "") -> Credential:
    """One credential by id or name, or 404 (also another team's)."""
    found = credential_list(user=user)
    credential = (found.filter(pk=pk) if pk is not None else found.filter(name=name)).first()
    if credential is None:
        raise Http404("no such credential")
    return credential


def authoring_teams(user: Person) -> list[Team]:
    """The teams where ``user`` may make workflows and credentials: the choice a form offers
    when there is more than one (every team for a global role)."""
    teams = teams_where(user, Capability.AUTHOR_WORKFLOWS)
    return list(Team.objects.all() if teams is None else Team.objects.filter(pk__in=teams))


@dataclass(frozen=True)
class SettingView:
    """One setting as runs use it now (the latest published version's) and, when the draft
    would change it, the draft's value."""

    label: str
    now: str
    draft: str | None


def settings_views(
    published: dict[str, Any] | None, draft: dict[str, Any] | None
) -> list[SettingView]:
    """The identity and settings of two documents (a published version's, the draft's) side by
    side, in words. ``published`` None: nothing is published, runs use nothing yet (''). A
    draft whose settings do not validate yet shows no values of its own."""
    now = _setting_words(published) if published is not None else {}
    then = _setting_words(draft) if draft is not None else {}
    labels = list(now or then)
    return [
        SettingView(
            label=label,
            now=now.get(label, ""),
            draft=then[label] if label in then and then[label] != now.get(label) else None,
        )
        for label in labels
    ]


def _setting_words(document: dict[str, Any]) -> dict[str, str]:
    try:
        settings = WorkflowSettings.model_validate(document.get("settings") or {})
    except ValueError:
        return {}
    policy = settings.approval
    filmstrip = (
        f"a frame every {settings.filmstrip_seconds_per_frame:g} s, "
        f"at most {settings.filmstrip_max_mb} MB"
        if settings.filmstrip
        else "off"
    )
    passkey = (
        f"above {policy.passkey_above_amount}" if policy.passkey == "above" else policy.passkey
    )
    return {
        "Name": str(document.get("name", "")),
        "Description": str(document.get("description") or "none"),
        "Reviewer group": str(document.get("reviewer_group") or "Reviewers"),
        "Allowed hosts": ", ".join(settings.allowed_hosts),
        "Step budget": f"{settings.step_budget} steps",
        "Time limit": f"{settings.run_ttl_minutes} min",
        "Runs at once": str(settings.max_concurrent_runs),
        "Approvals needed": str(policy.quorum),
        "Approval expires after": f"{policy.expiry_minutes} min",
        "Author may approve": "yes" if policy.author_may_approve else "no",
        "Reminder": f"{policy.remind_before_minutes} min before expiry"
        if policy.remind_before_minutes
        else "none",
        "Escalation": f"to {policy.escalation_group} after {policy.escalate_after_minutes} min"
        if policy.escalate_after_minutes
        else "never",
        "Slack channel": policy.slack_channel or "none",
        "Passkey with every verdict": passkey,
        "Filmstrip": filmstrip,
        "Credentials": ", ".join(settings.credentials) or "none",
    }
