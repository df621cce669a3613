from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from django.contrib.auth.models import Group
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.http import Http404
from django.utils import timezone

from approvals.models import (
    ApprovalComment,
    ApprovalDecision,
    ApprovalRequest,
    Question,
    ReviewerAbsence,
)
from approvals.policy import approval_refusal
from pandaweb.audit.models import AuditEvent
from pandaweb.core.models import Membership
from pandaweb.core.permissions import in_teams, people_with, teams_where, user_can
from pandaweb.core.roles import Capability, Role
from sessions.models import Run, StepResult
from workflows.models import Workflow

QUEUE_LIMIT = 200


def _questions_waiting_for(user: Any) -> QuerySet[Question]:
    """Pending questions this person may answer: of their own runs, or asked of a group they
    are in, of runs of the teams where they may watch runs (the rule of
    ``questions.question_refusal``, as a query)."""

    if not user.is_authenticated or not user.is_active:
        return Question.objects.none()
    groups = user.groups.values("name")  # a subquery: one query for the whole count
    # A team role is also asked of its members in the run's team.
    as_member = Membership.objects.filter(
        user_id=user.pk, team_id=OuterRef("run__team_id"), role=OuterRef("answered_by")
    )
    mine = (
        Q(answered_by="launcher", run__launched_by=user)
        | Q(answered_by__in=groups)
        | Q(Exists(as_member))
    )
    pending = Question.objects.filter(mine, status=Question.Status.PENDING)
    return in_teams(pending, user, Capability.VIEW_RUNS, via="run__team")


def questions_for(user: Any, *, limit: int = 50) -> list[Question]:
    """Pending questions this person may answer, soonest to expire first."""
    return list(
        _questions_waiting_for(user)
        .select_related("run__workflow", "run__launched_by")
        .order_by("expires_at", "pk")[:limit]
    )


def question_count_for(user: Any) -> int:
    """How many questions wait for this person's answer (the navigation badge, the home page)."""
    return _questions_waiting_for(user).count()


def question_run_id(question_id: int, *, user: Any) -> int:
    """The run of a question (404 when there is none, or it is another team's); its page
    decides who sees it."""
    questions = in_teams(Question.objects.all(), user, Capability.VIEW_RUNS, via="run__team")
    found = questions.filter(pk=question_id).values_list("run_id", flat=True).first()
    if found is None:
        raise Http404("no such question")
    return found


def question_pending(run: Run) -> Question | None:
    return run.questions.filter(status=Question.Status.PENDING).order_by("-pk").first()


def approval_pending_count(user: Any) -> int:
    """Pending requests of the teams whose queue ``user`` sees."""
    pending = ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING)
    return in_teams(pending, user, Capability.VIEW_APPROVALS, via="run__team").count()


@dataclass(frozen=True)
class NeedsBadge:
    """The navigation's badge: what waits for this person. On the Approvals item for people
    who see the queue (its pending requests and the questions for them); on the Runs item for
    the others, who may still be asked (the launcher of a run, a member of a group)."""

    on: str  # the navigation item it sits on: "approvals", "runs" or "" (no badge)
    approvals: int
    questions: int

    @property
    def total(self) -> int:
        return self.approvals + self.questions


def needs_badge(user: Any) -> NeedsBadge:
    """The badge of ``user`` now: one query per number, none for what they may not see."""
    sees_approvals = user_can(user, Capability.VIEW_APPROVALS)
    sees_runs = user_can(user, Capability.VIEW_RUNS)
    if not (sees_approvals or sees_runs):
        return NeedsBadge(on="", approvals=0, questions=0)
    return NeedsBadge(
        on="approvals" if sees_approvals else "runs",
        approvals=approval_pending_count(user) if sees_approvals else 0,
        # Answering on the run page needs to watch runs: without it nobody is asked.
        questions=question_count_for(user) if sees_runs else 0,
    )


def approval_queue(
    *, user: Any, workflow_slug: str = "", pending_only: bool = True
) -> QuerySet[ApprovalRequest]:
    """The queue of the teams ``user`` sees it in: pending requests oldest first (the next to
    decide on top); with every status, the latest first."""
    requests = in_teams(
        ApprovalRequest.objects.all(), user, Capability.VIEW_APPROVALS, via="run__team"
    ).select_related("run__workflow", "run__version", "run__launched_by")
    if workflow_slug:
        requests = requests.filter(run__workflow__slug=workflow_slug)
    if pending_only:
        return requests.filter(status=ApprovalRequest.Status.PENDING).order_by("created_at", "pk")
    return requests.order_by("-created_at", "-pk")[:QUEUE_LIMIT]


def approval_queue_workflows(user: Any) -> QuerySet[Workflow]:
    """Workflows of ``user``'s queue that ever asked for an approval: its filter choices."""
    return (
        in_teams(Workflow.objects.all(), user, Capability.VIEW_APPROVALS)
        .filter(runs__approvals__isnull=False)
        .distinct()
        .only("name", "slug")
        .order_by("name")
    )


def approvals_visible_to(user: Any) -> QuerySet[ApprovalRequest]:
    """The requests ``user`` may open (``approval_visible_to`` as a query): those of the teams
    whose queue they see, and those of their own runs in the teams where they watch runs."""
    queue = teams_where(user, Capability.VIEW_APPROVALS)
    if queue is None:
        return ApprovalRequest.objects.all()
    runs = teams_where(user, Capability.VIEW_RUNS)
    own = Q(run__launched_by_id=user.pk)
    if runs is not None:
        own &= Q(run__team__in=runs)
    return ApprovalRequest.objects.filter(Q(run__team__in=queue) | own)


def approval_get(approval_id: int, *, user: Any) -> ApprovalRequest:
    """The request (with its run, workflow and people) or 404, also for another team's: its id
    tells ``user`` nothing. Whether they may open one of their teams' is
    ``approval_visible_to``'s answer."""
    queue = teams_where(user, Capability.VIEW_APPROVALS)
    runs = teams_where(user, Capability.VIEW_RUNS)
    requests = ApprovalRequest.objects.all()
    if queue is not None and runs is not None:
        requests = requests.filter(run__team__in=queue | runs)
    try:
        return requests.select_related(
            "run__workflow", "run__version__author", "run__launched_by", "previous", "assignee"
        ).get(pk=approval_id)
    except ApprovalRequest.DoesNotExist:
        raise Http404("no such approval request") from None


def approval_visible_to(user: Any, approval: ApprovalRequest) -> bool:
    """Whether ``user`` may open the request: people who see the queue in its run's team, and
    the person who launched its run (to follow their own run, never to decide it)."""
    run = approval.run
    if user_can(user, Capability.VIEW_APPROVALS, team_id=run.team_id):
        return True
    own = run.launched_by_id == user.pk
    return own and user_can(user, Capability.VIEW_RUNS, team_id=run.team_id)


def approval_decisions(approval: ApprovalRequest) -> QuerySet[ApprovalDecision]:
    return approval.decisions.select_related("reviewer").order_by("created_at", "pk")


def approval_successor(approval: ApprovalRequest) -> ApprovalRequest | None:
    """The request that replaced this one because the page changed since approval."""
    return ApprovalRequest.objects.filter(previous=approval).first()


def approval_timeline(run: Run) -> QuerySet[StepResult]:
    """The run's steps so far (the gated step has not run yet)."""
    return run.step_results.order_by("index")


# What the reviewer compares --------------------------------------------------------------------


@dataclass(frozen=True)
class SourceValue:
    """One value the run started from (an input) or read from the portal (an output)."""

    kind: str  # "input" or "output"
    name: str
    label: str
    value: str
    unit: str = ""
    used: bool = False


@dataclass(frozen=True)
class FilledValue:
    """One value the run typed into the portal, with where it came from."""

    field: str
    value: str
    secret: bool
    step_id: str
    on_page: str | None  # what the field holds now (None: not on this page, or secret)
    on_this_page: bool
    sources: list[SourceValue]

    @property
    def page_differs(self) -> bool:
        return self.on_this_page and self.on_page is not None and self.on_page != self.value


@dataclass(frozen=True)
class EvidenceValues:
    filled: list[FilledValue]
    inputs: list[SourceValue]
    outputs: list[SourceValue]


def _same(left: str, right: str) -> bool:
    """Equal once spacing and letter case are ignored ("DE97 2004" is "de972004")."""
    a, b = "".join(left.split()).casefold(), "".join(right.split()).casefold()
    return bool(a) and a == b


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def approval_values(approval: ApprovalRequest) -> EvidenceValues:
    """The typed values next to the run's inputs and extracted outputs, as frozen in the
    evidence, each typed value linked to the inputs and outputs that hold the same value."""
    evidence = approval.evidence or {}
    run = approval.run
    parameters = {
        p.get("name"): p
        for p in ((run.version.document or {}) if run else {}).get("parameters", [])
    }
    inputs = [
        SourceValue(
            kind="input",
            name=name,
            label=_text(parameters.get(name, {}).get("label")) or name,
            value=_text(value),
            unit=_text(parameters.get(name, {}).get("currency")),
        )
        for name, value in (evidence.get("inputs") or {}).items()
    ]
    outputs = [
        SourceValue(kind="output", name=name, label=name, value=_text(value))
        for name, value in (evidence.get("outputs") or {}).items()
    ]
    filled = []
    for entry in evidence.get("filled") or []:
        value = _text(entry.get("value"))
        secret = bool(entry.get("secret"))
        sources = [] if secret else [s for s in inputs + outputs if _same(s.value, value)]
        filled.append(
            FilledValue(
                field=_text(entry.get("field")),
                value=value,
                secret=secret,
                step_id=_text(entry.get("step_id")),
                on_page=None if entry.get("on_page") is None else _text(entry["on_page"]),
                on_this_page="on_page" in entry,
                sources=sources,
            )
        )
    used = {(s.kind, s.name) for f in filled for s in f.sources}
    return EvidenceValues(
        filled=filled,
        inputs=[replace(s, used=(s.kind, s.name) in used) for s in inputs],
        outputs=[replace(s, used=(s.kind, s.name) in used) for s in outputs],
    )


def approval_decidable_by(user: Any) -> QuerySet[ApprovalRequest]:
    """Pending requests ``user`` may decide, oldest first: the same rules as
    ``approvals.policy.approval_refusal`` (DECIDE_APPROVALS in the run's team, its reviewer
    group there or admin, not the launcher, not the version's author unless the workflow lets
    authors approve), as one query."""

    requests = in_teams(
        ApprovalRequest.objects.all(), user, Capability.DECIDE_APPROVALS, via="run__team"
    ).select_related("run__workflow", "run__version", "run__launched_by")
    requests = requests.filter(status=ApprovalRequest.Status.PENDING)
    if not user_can(user, Capability.DECIDE_APPROVALS):
        return requests.none()
    groups = set(user.groups.values_list("name", flat=True))
    if not (user.is_superuser or Role.ADMINS.value in groups):
        # The Reviewers group is also a Reviewers membership in the run's team.
        reviewing = Membership.objects.filter(user_id=user.pk, role=Role.REVIEWERS.value).values(
            "team_id"
        )
        requests = requests.filter(
            Q(reviewer_group__in=groups)
            | Q(reviewer_group=Role.REVIEWERS.value, run__team__in=reviewing)
        )
    return (
        requests.exclude(run__launched_by=user)
        .exclude(Q(run__version__author=user) & Q(author_may_approve=False))
        .order_by("created_at", "pk")
    )


def approval_comments(approval: ApprovalRequest) -> QuerySet[ApprovalComment]:
    return approval.comments.select_related("author").order_by("created_at", "pk")


def approval_absent_today(user_ids: list[int]) -> set[int]:
    """Which of these people are out of office today."""
    today = timezone.localdate()
    return set(
        ReviewerAbsence.objects.filter(
            user_id__in=user_ids, away_from__lte=today, away_until__gte=today
        ).values_list("user_id", flat=True)
    )


def approval_handover_choices(approval: ApprovalRequest) -> tuple[list[Any], list[str]]:
    """People who may decide this request and groups that decide approvals: whom it can be
    handed to (the service checks again)."""

    candidates = people_with(Capability.DECIDE_APPROVALS, team_id=approval.run.team_id).order_by(
        "username"
    )
    people = [u for u in candidates if approval_refusal(u, approval) is None]
    groups = list(
        Group.objects.filter(permissions__codename=Capability.DECIDE_APPROVALS.value)
        .order_by("name")
        .values_list("name", flat=True)
    )
    return people, groups


@dataclass(frozen=True)
class HistoryEntry:
    """One line of a request's history on its decision page: a comment or an audited change."""

    at: Any
    kind: str  # "comment" or the audit action without its "approval." prefix
    who: str
    text: str
    body: str = ""


def _history_text(event: AuditEvent) -> tuple[str, str]:
    after = event.after or {}
    action = event.action.removeprefix("approval.")
    if action == "requested":
        return "The run asked for this approval.", ""
    if action == "reminded":
        return "A reminder went to the reviewers: it expires soon.", ""
    if action == "escalated":
        return f"Escalated to {after.get('group')}, who may decide it now.", ""
    if action == "reassigned":
        to = after.get("assignee") or after.get("group")
        return f"handed it to {to}.", str(after.get("note") or "")
    if action == "decided":
        verb = "approved" if after.get("verdict") == "approve" else "rejected"
        return f"{verb}.", str(after.get("reason") or "")
    if action == "expired":
        return "Expired undecided.", ""
    if action == "voided":
        return "Voided.", str(after.get("reason") or "")
    return action.replace("_", " ").capitalize() + ".", ""


def approval_history(approval: ApprovalRequest) -> list[HistoryEntry]:
    """The request's comments and audited changes (asked, reminded, escalated, handed over,
    decided, closed), oldest first."""
    entries = [
        HistoryEntry(
            at=c.created_at, kind="comment", who=c.author.get_username(), text="", body=c.body
        )
        for c in approval_comments(approval)
    ]
    events = AuditEvent.objects.filter(
        approval_id=approval.pk, action__startswith="approval."
    ).exclude(action="approval.commented")
    for event in events.order_by("sequence"):
        text, body = _history_text(event)
        who = event.actor_label if event.actor_kind == AuditEvent.ActorKind.USER else ""
        entries.append(
            HistoryEntry(
                at=event.occurred_at,
                kind=event.action.removeprefix("approval."),
                who=who,
                text=text,
                body=body,
            )
        )
    return sorted(entries, key=lambda e: e.at)
