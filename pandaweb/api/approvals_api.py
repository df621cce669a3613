"""Approval requests over the API: the queue, a request with its frozen evidence, the verdict
bound to the evidence hash, comments and hand-over; the decision page's services and policy.
"""

from __future__ import annotations

from django.contrib.auth.models import Group, User
from django.http import HttpRequest
from ninja import Router, Status

from approvals import selectors as approval_selectors
from approvals.models import ApprovalComment, ApprovalRequest
from approvals.policy import approval_audience, approval_refusal
from approvals.services import (
    ApprovalRefused,
    approval_comment,
    approval_decide,
    approval_reassign,
)
from pandaweb.api import problems
from pandaweb.api.access import token_with_scope
from pandaweb.api.documents import approval_summary, file_url
from pandaweb.api.paging import MAX_PAGE
from pandaweb.api.problems import Problem
from pandaweb.api.schemas import (
    ApprovalCommentOut,
    ApprovalOut,
    ApprovalSummary,
    CommentIn,
    DecisionIn,
    HandOverIn,
)
from pandaweb.api.scopes import Scope

# Approvals ---------------------------------------------------------------------------------------

router = Router(tags=["approvals"])


def _approval_out(approval: ApprovalRequest) -> ApprovalOut:
    """The request as ``approval_get`` reads it (its assignee joined): three queries whatever the
    number of its decisions and comments (the approvals counted, the decisions and the comments,
    each with their people)."""
    decisions = list(approval_selectors.approval_decisions(approval))
    return ApprovalOut(
        **approval_summary(approval).model_dump(),
        run=approval.run_id,
        workflow=approval.run.workflow.slug,
        launched_by=approval.run.launched_by.get_username(),
        reason=approval.reason,
        decided_at=approval.decided_at,
        evidence=approval.evidence,
        decisions=[
            {
                "reviewer": d.reviewer.get_username(),
                "verdict": d.verdict,
                "reason": d.reason,
                "evidence_sha256": d.evidence_sha256,
                "at": d.created_at.isoformat(),
            }
            for d in decisions
        ],
        screenshot=file_url(approval.run_id, approval.outlined or approval.screenshot),
        reviewer_group=approval.reviewer_group,
        escalated_to=approval.escalation_group
        if approval.escalated_at and approval.escalation_group
        else None,
        assignee=approval.assignee.get_username() if approval.assignee else None,
        comments=[_comment_out(c) for c in approval_selectors.approval_comments(approval)],
    )


def _comment_out(comment: ApprovalComment) -> ApprovalCommentOut:
    return ApprovalCommentOut(
        id=comment.pk,
        author=comment.author.get_username(),
        body=comment.body,
        created_at=comment.created_at,
    )


def _refused(exc: ApprovalRefused, *, status: int, type: str) -> Problem:
    """A refusal of an approval service in its words: 422 on the fields it names, else
    ``status``."""
    if exc.field_errors:
        return Problem(422, str(exc), errors=problems.field_errors(exc.field_errors))
    return Problem(status, str(exc), type=type)


@router.get("/", response=list[ApprovalSummary], url_name="approval_list")
def approval_list(request: HttpRequest) -> list[ApprovalSummary]:
    """Pending requests the token's owner may decide (not their own runs; their reviewer group),
    oldest first."""
    context = token_with_scope(request, Scope.APPROVALS_READ)
    pending = approval_selectors.approval_decidable_by(context.user).prefetch_related("decisions")
    return [approval_summary(a) for a in pending[:MAX_PAGE]]


@router.get("/{int:approval_id}", response=ApprovalOut, url_name="approval_get")
def approval_get(request: HttpRequest, approval_id: int) -> ApprovalOut:
    """The request with its frozen evidence and ``evidence_sha256``: quote that hash to decide."""
    context = token_with_scope(request, Scope.APPROVALS_READ)
    approval = approval_selectors.approval_get(approval_id, user=context.user)
    # One of the owner's teams' requests, which the page too opens only for who sees that
    # team's queue or launched the run.
    if not approval_selectors.approval_visible_to(context.user, approval):
        raise Problem(403, "you may not see this request", type="approval-hidden")
    return _approval_out(approval)


@router.post("/{int:approval_id}/decision", response=ApprovalOut, url_name="approval_decide")
def decide(request: HttpRequest, approval_id: int, payload: DecisionIn) -> ApprovalOut:
    """Approve or reject, quoting the evidence hash you saw. The page's policy applies:
    separation of duties, reviewer group, quorum, expiry."""
    context = token_with_scope(request, Scope.APPROVALS_DECIDE)
    user: User = context.user
    approval = approval_selectors.approval_get(approval_id, user=user)
    refusal = approval_refusal(user, approval)
    if refusal:
        raise Problem(403, refusal, type="decision-refused")
    if approval.status == ApprovalRequest.Status.PENDING and (
        payload.evidence_sha256 != approval.evidence_sha256
    ):
        raise Problem(
            409,
            "the evidence changed since you read it: get the request again and look",
            type="evidence-mismatch",
            evidence_sha256=approval.evidence_sha256,
        )
    try:
        approval_decide(
            approval_id=approval_id,
            user=user,
            approve=payload.verdict == "approve",
            reason=payload.reason,
            evidence_sha256=payload.evidence_sha256,
        )
    except ApprovalRefused as exc:
        raise _refused(exc, status=409, type="decision-refused") from None
    return _approval_out(approval_selectors.approval_get(approval_id, user=user))


@router.post(
    "/{int:approval_id}/comments",
    response={201: ApprovalCommentOut},
    url_name="approval_comment",
    summary="Comment on a request",
)
def comment(
    request: HttpRequest, approval_id: int, payload: CommentIn
) -> Status[ApprovalCommentOut]:
    """A remark for everyone who reviews the request, shown in its history (the page's comment
    form): never a verdict, it changes nothing about the request, whatever its status. Whoever
    may open the request comments: the queue of its run's team, and the run's launcher. Not
    idempotent: each call adds a comment. An empty one is a 422 on ``body``.

    Scope: ``approvals:comment``."""
    context = token_with_scope(request, Scope.APPROVALS_COMMENT)
    user: User = context.user
    approval = approval_selectors.approval_get(approval_id, user=user)
    try:
        made = approval_comment(approval_id=approval.pk, user=user, body=payload.body)
    except ApprovalRefused as exc:
        # Not a matter of the request's state: the person may not open it.
        raise _refused(exc, status=403, type="comment-refused") from None
    return Status(201, _comment_out(made))


@router.post(
    "/{int:approval_id}/assignee",
    response=ApprovalOut,
    url_name="approval_hand_over",
    summary="Hand a request over",
)
def hand_over(request: HttpRequest, approval_id: int, payload: HandOverIn) -> ApprovalOut:
    """Hand a pending request to one person (``username``: someone of the run's team the policy
    lets decide it) or to one group (``group``: one whose members decide approvals), as the
    page's hand-over: they are told, with ``note``. Only someone who may decide the request hands
    it over (403 otherwise); a decided request, or someone who may not decide it, is a 409 in
    words. Not idempotent: each hand-over is audited.

    Scope: ``approvals:decide``."""
    context = token_with_scope(request, Scope.APPROVALS_DECIDE)
    user: User = context.user
    approval = approval_selectors.approval_get(approval_id, user=user)
    refusal = approval_refusal(user, approval)
    if refusal:
        raise Problem(403, refusal, type="handover-refused")
    username, group = payload.username.strip(), payload.group.strip()
    if bool(username) == bool(group):
        raise Problem(
            422,
            "the request is not valid",
            errors=[{"field": "", "message": "name one person (username) or one group (group)"}],
        )
    assignee = _team_person(approval, username) if username else None
    if group and not Group.objects.filter(name=group).exists():
        raise Problem(
            422,
            "the request is not valid",
            errors=[{"field": "group", "message": f"there is no group named {group!r}"}],
        )
    try:
        approval_reassign(
            approval_id=approval.pk, user=user, assignee=assignee, group=group, note=payload.note
        )
    except ApprovalRefused as exc:
        raise _refused(exc, status=409, type="handover-refused") from None
    return _approval_out(approval_selectors.approval_get(approval_id, user=user))


def _team_person(approval: ApprovalRequest, username: str) -> User:
    """The person named ``username`` among the active people of the run's team (who may decide
    its approvals or watch its runs), or a 422 on ``username``. Someone of another team is
    answered as nobody is: the refusal names no other team's people."""
    named = User.objects.filter(username=username).values_list("pk", flat=True).first()
    person = approval_audience(approval, groups=[], people=[named]).first() if named else None
    if person is None:
        raise Problem(
            422,
            "the request is not valid",
            errors=[
                {"field": "username", "message": f"nobody named {username!r} is in this run's team"}
            ],
        )
    return person
