"""The human gate: opening a request with its evidence, deciding it, expiring it.

Every change locks the run first and then the request (the order the runner's own writes use),
in one transaction with its audit events. The policy is enforced here, so every entry point (the
decision page, an htmx post, any API) gets the same answers.
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import timedelta
from typing import Any, Literal, Protocol

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import transaction
from django.utils import timezone

from approvals import passkeys
from approvals.events import publish_pending_changed
from approvals.facts import facts_line
from approvals.models import ApprovalComment, ApprovalDecision, ApprovalRequest, ReviewerAbsence
from approvals.policy import approval_audience, approval_refusal
from approvals.questions import question_expire_due, question_remind_due, question_void_pending
from approvals.selectors import approval_absent_today, approval_visible_to
from approvals.slack import minutes_left
from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record
from pandaweb.core.dispatch import dispatch, task_named
from pandaweb.core.permissions import people_with
from pandaweb.core.roles import Capability, Role
from pandaweb.reviewers.notify import ApprovalEvent, notify
from pandaweb.webhooks.services import outbox_record_approval
from sessions.models import Run
from sessions.services.records import lock_run
from sessions.services.runstate import destroy_sandbox, host_queue, run_files_dir, transition

logger = logging.getLogger(__name__)

A = ApprovalRequest.Status
NoticeKind = Literal["approval.requested", "approval.reminded", "approval.escalated"]


class ApprovalRefused(Exception):
    """The decision is not allowed or no longer possible; the message is for people."""

    def __init__(self, message: str, field_errors: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.field_errors = field_errors or {}


# Opening -----------------------------------------------------------------------------------------


class Gate(Protocol):
    """What the runner hands over at an irreversible step (``sessions.engine.plan.Gate``)."""

    @property
    def evidence(self) -> dict[str, Any]: ...
    @property
    def screenshot(self) -> bytes: ...
    @property
    def outlined(self) -> bytes: ...
    @property
    def changes(self) -> tuple[str, ...]: ...


def approval_open(*, run: Run, gate: Gate, previous: ApprovalRequest | None) -> ApprovalRequest:
    """Freeze the evidence of a gate into a pending request (inside the caller's transaction,
    with ``run`` locked). ``previous`` is the approved request whose page changed since."""

    document = run.version.document or {}
    policy = run.version.settings_model.approval
    evidence = gate.evidence
    directory = run_files_dir(run.pk) / "approvals"
    directory.mkdir(parents=True, exist_ok=True)
    number = run.approvals.count() + 1
    stem = f"{number:02d}-{evidence['step_id']}"
    screenshot_path = directory / f"{stem}.png"
    screenshot_path.write_bytes(gate.screenshot)
    outlined = gate.outlined
    outlined_path = directory / f"{stem}.outlined.png"
    outlined_path.write_bytes(outlined)
    sealed = {
        **evidence,
        "changes": list(gate.changes),
        "screenshot_sha256": hashlib.sha256(gate.screenshot).hexdigest(),
        "outlined_sha256": hashlib.sha256(outlined).hexdigest(),
    }
    approval = ApprovalRequest.objects.create(
        run=run,
        step_index=evidence["step_index"],
        step_id=evidence["step_id"],
        action=evidence["action"],
        evidence=sealed,
        evidence_sha256=evidence_hash(sealed),
        screenshot=str(screenshot_path.relative_to(run_files_dir(run.pk))),
        outlined=str(outlined_path.relative_to(run_files_dir(run.pk))),
        quorum=policy.quorum,
        author_may_approve=policy.author_may_approve,
        reviewer_group=document.get("reviewer_group", Role.REVIEWERS.value),
        remind_before_minutes=policy.remind_before_minutes,
        escalate_after_minutes=policy.escalate_after_minutes,
        escalation_group=policy.escalation_group,
        expires_at=timezone.now() + timedelta(minutes=policy.expiry_minutes),
        previous=previous,
    )
    if previous is not None:
        previous.status = A.VOIDED
        previous.reason = "the page changed since approval: " + "; ".join(gate.changes)
        previous.save(update_fields=["status", "reason"])
        _cards_changed(previous)
    audit_record(
        action="approval.requested",
        object_type="approval",
        object_id=approval.pk,
        team_id=run.team_id,
        actor_kind=AuditEvent.ActorKind.RUNNER,
        after={
            "action": approval.action,
            "evidence_sha256": approval.evidence_sha256,
            "expires_at": approval.expires_at.isoformat(),
            "quorum": approval.quorum,
            "supersedes": previous.pk if previous else None,
        },
        run_id=run.pk,
        approval_id=approval.pk,
    )
    # Announced by the run's move to waiting (``outbox_record_run``), so the message carries
    # the run's status after it.
    publish_pending_changed()
    _notify_reviewers(approval)
    if settings.SLACK_BOT_TOKEN and policy.slack_channel:
        dispatch(
            task_named("approvals.slack_card_post"),
            approval_id=approval.pk,
            channel=policy.slack_channel,
        )
    return approval


def evidence_hash(evidence: dict[str, Any]) -> str:
    canonical = json.dumps(evidence, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _notify_reviewers(approval: ApprovalRequest) -> None:
    run = approval.run
    approval_notify(
        approval=approval,
        users=_recipients(approval, groups=[approval.reviewer_group, Role.ADMINS.value]),
        subject=f"Approval needed: {run.workflow.name} (run #{run.pk})",
        body=_mail_body(approval),
    )


def _mail_body(approval: ApprovalRequest, lead: str = "") -> str:
    """The message's first line is what a push shows: the facts to decide on, where the
    workflow declares them."""
    run = approval.run
    facts = facts_line(approval)
    head = f"{lead}{facts}\n" if facts else lead
    return (
        f"{head}{approval.action}\n\nRequested by run #{run.pk}, launched by "
        f"{run.launched_by.get_username()}.\nDecide before {approval.expires_at:%Y-%m-%d %H:%M} "
        f"UTC: {settings.PANDAWEB_BASE_URL}/approvals/{approval.pk}/\n"
    )


def _recipients(
    approval: ApprovalRequest, *, groups: list[str], people: list[User] | None = None
) -> list[User]:
    """Active members of ``groups`` of the run's team, and those of ``people`` still in it, less
    those out of office today and those who already decided. Absence silences notifications
    only; it never changes who may decide."""

    decided = set(approval.decisions.values_list("reviewer_id", flat=True))
    members = approval_audience(approval, groups=groups, people=[u.pk for u in people or []])
    found = {u.pk: u for u in members}
    away = approval_absent_today(list(found))
    return [u for pk, u in sorted(found.items()) if pk not in away and pk not in decided]


def approval_notify(
    *,
    approval: ApprovalRequest,
    users: list[User],
    subject: str,
    body: str,
    kind: NoticeKind = "approval.requested",
    nudge: str = "",
) -> None:
    """Tell ``users`` about ``approval`` once the caller's transaction commits, each through the
    channels they chose (pandaweb.reviewers.notify: e-mail, Slack, browser push, quiet hours).

    The one place approval messages leave pandaweb. A delivery failure is logged by ``notify``
    and never undoes the change it announces. ``nudge`` (a reminder, an escalation) is what a
    Slack card the person already has gets in its thread instead of a second card.
    """

    if not users:
        return
    event = ApprovalEvent(
        kind=kind,
        approval_id=approval.pk,
        title=subject,
        body=body,
        url=f"{settings.PANDAWEB_BASE_URL}/approvals/{approval.pk}/",
        nudge=nudge,
    )

    def send() -> None:
        for user in users:
            notify(user, event)

    transaction.on_commit(send)


# Deciding ----------------------------------------------------------------------------------------


def approval_decide(
    *,
    approval_id: int,
    user: User,
    approve: bool,
    reason: str = "",
    evidence_sha256: str,
    passkey_assertion: str = "",
) -> ApprovalRequest:
    """Record one reviewer's verdict; the request closes at quorum or at the first rejection.

    ``evidence_sha256`` is the hash of the evidence the reviewer was shown: a verdict on other
    evidence is refused. Where the workflow asks for a passkey, ``passkey_assertion`` (the
    browser's WebAuthn answer, JSON) must verify against a challenge issued for this request's
    evidence. A reviewer's second verdict on the same request changes nothing.
    """
    reason = reason.strip()
    if not approve and not reason:
        raise ApprovalRefused(
            "a rejection needs a reason", {"reason": ["Say why you reject this action."]}
        )
    run_id = ApprovalRequest.objects.values_list("run_id", flat=True).get(pk=approval_id)
    approved = False
    destroy: dict[str, Any] | None = None
    with transaction.atomic():
        run = lock_run(run_id)
        approval = ApprovalRequest.objects.select_for_update().get(pk=approval_id)
        refusal = approval_refusal(user, approval)
        if refusal:
            raise ApprovalRefused(refusal)
        if approval.status != A.PENDING:
            raise ApprovalRefused(
                f"this request is already {approval.get_status_display().lower()}"
            )
        expired_now = timezone.now() >= approval.expires_at
        if expired_now:
            destroy = _expire(run, approval)
        elif evidence_sha256 != approval.evidence_sha256:
            raise ApprovalRefused("the evidence changed since you opened it: look again")
        elif approval.decisions.filter(reviewer=user).exists():
            return approval  # a double click: the first one counted
        else:
            passkey = _step_up(approval, user, passkey_assertion)
            ApprovalDecision.objects.create(
                request=approval,
                reviewer=user,
                verdict=ApprovalDecision.Verdict.APPROVE
                if approve
                else ApprovalDecision.Verdict.REJECT,
                reason=reason,
                evidence_sha256=approval.evidence_sha256,
            )
            # Only the verdicts of people who may still decide in the run's team count: one who
            # left the team since approving no longer makes up the quorum.
            approvals = approval.decisions.filter(
                verdict=ApprovalDecision.Verdict.APPROVE,
                reviewer__in=people_with(Capability.DECIDE_APPROVALS, team_id=run.team_id),
            ).count()
            audit_record(
                action="approval.decided",
                object_type="approval",
                object_id=approval.pk,
                team_id=run.team_id,
                actor=user,
                after={
                    "verdict": "approve" if approve else "reject",
                    "reason": reason,
                    "evidence_sha256": approval.evidence_sha256,
                    "approvals": approvals,
                    "quorum": approval.quorum,
                    **({"passkey": passkey} if passkey else {}),
                },
                run_id=run.pk,
                approval_id=approval.pk,
            )
            _cards_changed(approval)
            if not approve:
                destroy = _close_run(
                    run, approval, A.REJECTED, reason=f"rejected by {user.get_username()}: {reason}"
                )
            elif approvals >= approval.quorum:
                _approve(run, approval)
                approved = True
        if destroy is None and not approved and not expired_now:
            return approval
    if destroy:
        destroy_sandbox(destroy)
    if expired_now:
        raise ApprovalRefused("this request is already expired")
    return approval


def _step_up(approval: ApprovalRequest, user: User, assertion: str) -> str:
    """The passkey step-up where the workflow asks for it: the name of the passkey that
    confirmed the verdict ("" when none is needed)."""

    if not passkeys.passkey_required(approval):
        return ""
    try:
        return passkeys.step_up_verify(approval=approval, user=user, assertion=assertion).name
    except passkeys.StepUpRefused as refused:
        raise ApprovalRefused(str(refused)) from None


def _cards_changed(approval: ApprovalRequest) -> None:
    """Bring the request's chat cards up to date once this transaction commits."""
    if not settings.SLACK_BOT_TOKEN:
        return
    dispatch(task_named("approvals.slack_cards_update"), approval_id=approval.pk)


def _channel_nudged(approval: ApprovalRequest, run: Run, text: str) -> None:
    """Reply ``text`` in the thread of the request's card in the workflow's channel (once this
    transaction commits), so the channel hears of a reminder or an escalation too."""
    channel = run.version.settings_model.approval.slack_channel
    if settings.SLACK_BOT_TOKEN and channel:
        dispatch(
            task_named("approvals.slack_card_nudge"),
            approval_id=approval.pk,
            channel=channel,
            text=text,
        )


def _approve(run: Run, approval: ApprovalRequest) -> None:
    # Sent first once this commits (on-commit work runs in order): the reviewer waits for the
    # action, the dashboards' refresh can follow it.
    dispatch_continuation(run.pk, approval.pk, host=str((run.sandbox or {}).get("host") or ""))
    now = timezone.now()
    approval.status = A.APPROVED
    approval.decided_at = now
    approval.save(update_fields=["status", "decided_at"])
    waited = now - approval.created_at
    transition(
        run,
        Run.Status.RUNNING,
        reason=f"step {approval.step_index + 1} approved",
        heartbeat_at=now,
        deadline_at=(run.deadline_at + waited) if run.deadline_at else None,
    )
    # After the transition: the message describes the run as it is once this commits.
    outbox_record_approval(approval=approval, run=run)
    publish_pending_changed()


def dispatch_continuation(run_id: int, approval_id: int, *, host: str | None = None) -> None:
    """Queue the continuation of an approved run for any worker of its sandbox's host (the
    browser and its egress supervisor are processes there; in the embedded default, this
    process's pool). Sending it twice is harmless: it runs once per approval."""

    if host is None:
        host = str((Run.objects.get(pk=run_id).sandbox or {}).get("host") or "")
    queue = host_queue(host) if host else None
    dispatch(task_named("runs.continue"), queue=queue, run_id=run_id, approval_id=approval_id)


def _close_run(
    run: Run, approval: ApprovalRequest, status: str, *, reason: str
) -> dict[str, Any] | None:
    """End a waiting run with its request (rejected or expired); returns the sandbox to destroy."""

    approval.status = status
    approval.decided_at = timezone.now()
    approval.reason = reason
    approval.save(update_fields=["status", "decided_at", "reason"])
    sandbox = run.sandbox
    if run.status == Run.Status.AWAITING_APPROVAL:
        transition(run, Run.Status.CANCELLED, reason=reason, sandbox=None)
    outbox_record_approval(approval=approval, run=run)
    publish_pending_changed()
    return sandbox


def _expire(run: Run, approval: ApprovalRequest) -> dict[str, Any] | None:
    sandbox = _close_run(run, approval, A.EXPIRED, reason="approval expired")
    audit_record(
        action="approval.expired",
        object_type="approval",
        object_id=approval.pk,
        team_id=run.team_id,
        after={"expired_at": approval.expires_at.isoformat()},
        run_id=run.pk,
        approval_id=approval.pk,
    )
    _cards_changed(approval)
    return sandbox


def approval_expire_due() -> list[int]:
    """Expire every pending request past its deadline: the run is cancelled, its browser
    destroyed. Fails closed: nothing ever continues on its own."""

    expired = []
    due = ApprovalRequest.objects.filter(status=A.PENDING, expires_at__lte=timezone.now())
    for approval_id, run_id in due.values_list("pk", "run_id"):
        with transaction.atomic():
            run = lock_run(run_id)
            approval = ApprovalRequest.objects.select_for_update().get(pk=approval_id)
            if approval.status != A.PENDING or approval.expires_at > timezone.now():
                continue
            sandbox = _expire(run, approval)
        if sandbox:
            destroy_sandbox(sandbox)
        expired.append(approval_id)
    return expired


def approval_void_pending(*, run: Run, reason: str) -> None:
    """Void the pending request (and open question) of a run that stops waiting for another
    reason (inside the caller's transaction, ``run`` locked)."""

    question_void_pending(run=run, reason=reason)
    for approval in ApprovalRequest.objects.select_for_update().filter(run=run, status=A.PENDING):
        approval.status = A.VOIDED
        approval.decided_at = timezone.now()
        approval.reason = reason
        approval.save(update_fields=["status", "decided_at", "reason"])
        audit_record(
            action="approval.voided",
            object_type="approval",
            object_id=approval.pk,
            team_id=run.team_id,
            after={"reason": reason},
            run_id=run.pk,
            approval_id=approval.pk,
        )
        publish_pending_changed()
        _cards_changed(approval)


# Hand-over: reminders, escalation, reassignment, comments, absence ---------------------------


def _lock(approval_id: int) -> tuple[Run, ApprovalRequest]:
    """The run, then the request, locked in the order every approval write uses."""

    run_id = ApprovalRequest.objects.values_list("run_id", flat=True).get(pk=approval_id)
    run = lock_run(run_id)
    return run, ApprovalRequest.objects.select_for_update().get(pk=approval_id)


def _mark_sent(approval: ApprovalRequest, column: str, now: Any) -> bool:
    """Claim a once-only message: set ``column`` only where it is still empty and the request
    still pending. False when another housekeeping pass got there first."""
    claimed = ApprovalRequest.objects.filter(
        pk=approval.pk, status=A.PENDING, **{f"{column}__isnull": True}
    ).update(**{column: now})
    setattr(approval, column, now)
    return claimed == 1


def approval_remind_due() -> list[int]:
    """Remind the reviewers of each pending request ``remind_before_minutes`` before it
    expires. Idempotent: each request is reminded at most once, whatever passes run."""
    now = timezone.now()
    due = ApprovalRequest.objects.filter(
        status=A.PENDING, reminded_at__isnull=True, remind_before_minutes__gt=0, expires_at__gt=now
    ).values_list("pk", "expires_at", "remind_before_minutes")
    reminded = []
    for approval_id, expires_at, before in due:
        if expires_at - timedelta(minutes=before) > now:
            continue
        with transaction.atomic():
            run, approval = _lock(approval_id)
            if not _mark_sent(approval, "reminded_at", now):
                continue
            audit_record(
                action="approval.reminded",
                object_type="approval",
                object_id=approval.pk,
                team_id=run.team_id,
                after={"expires_at": approval.expires_at.isoformat()},
                run_id=run.pk,
                approval_id=approval.pk,
            )
            groups = [approval.reviewer_group, Role.ADMINS.value]
            if approval.escalated_at and approval.escalation_group:
                groups.append(approval.escalation_group)
            people = [approval.assignee] if approval.assignee else []
            left = minutes_left(approval)
            nudge = f"Reminder: expires in {left} min, still waiting for a decision."
            approval_notify(
                approval=approval,
                users=_recipients(approval, groups=groups, people=people),
                subject=f"Reminder: approval expires in {left} min: {run.workflow.name} "
                f"(run #{run.pk})",
                body=_mail_body(approval, "Reminder, still waiting for a decision:\n\n"),
                kind="approval.reminded",
                nudge=nudge,
            )
            _cards_changed(approval)
            _channel_nudged(approval, run, nudge)
        reminded.append(approval_id)
    return reminded


def approval_escalate_due() -> list[int]:
    """Escalate each pending request undecided ``escalate_after_minutes`` after it was asked:
    its ``escalation_group`` is told and may decide from now on. Idempotent: once per request."""
    now = timezone.now()
    due = (
        ApprovalRequest.objects.filter(
            status=A.PENDING, escalated_at__isnull=True, escalate_after_minutes__gt=0
        )
        .exclude(escalation_group="")
        .values_list("pk", "created_at", "escalate_after_minutes")
    )
    escalated = []
    for approval_id, created_at, after in due:
        if created_at + timedelta(minutes=after) > now:
            continue
        with transaction.atomic():
            run, approval = _lock(approval_id)
            if not _mark_sent(approval, "escalated_at", now):
                continue
            audit_record(
                action="approval.escalated",
                object_type="approval",
                object_id=approval.pk,
                team_id=run.team_id,
                after={"group": approval.escalation_group, "after_minutes": after},
                run_id=run.pk,
                approval_id=approval.pk,
            )
            group = approval.escalation_group
            nudge = (
                f"Escalated to {group}: undecided for {after} min, so its members may decide it."
            )
            approval_notify(
                approval=approval,
                users=_recipients(approval, groups=[group]),
                subject=f"Approval escalated to {group}: {run.workflow.name} (run #{run.pk})",
                body=_mail_body(
                    approval,
                    f"Undecided for {after} minutes, so {group} may decide it now:\n\n",
                ),
                kind="approval.escalated",
                nudge=nudge,
            )
            _cards_changed(approval)
            _channel_nudged(approval, run, nudge)
        escalated.append(approval_id)
    return escalated


def approval_housekeeping() -> dict[str, list[int]]:
    """One housekeeping pass over pending requests: escalate, remind, then expire; and the
    questions: remind those about to time out, expire those nobody answered in time."""

    return {
        "escalated": approval_escalate_due(),
        "reminded": approval_remind_due(),
        "expired": approval_expire_due(),
        "questions_reminded": question_remind_due(),
        "questions_expired": question_expire_due(),
    }


def _decider_group(name: str) -> bool:
    """Whether the group ``name`` exists and its members may decide approvals."""

    return Group.objects.filter(
        name=name, permissions__codename=Capability.DECIDE_APPROVALS.value
    ).exists()


def approval_reassign(
    *,
    approval_id: int,
    user: User,
    assignee: User | None = None,
    group: str = "",
    note: str = "",
) -> ApprovalRequest:
    """Hand a pending request to a person (who must be allowed to decide it) or to a group
    (which must hold the capability to decide approvals); the new reviewers are told.

    Only someone who may decide it hands it over. Not idempotent: each call is audited.
    """
    group = group.strip()
    if (assignee is None) == (not group):
        raise ApprovalRefused("hand the request to one person or one group")
    with transaction.atomic():
        run, approval = _lock(approval_id)
        refusal = approval_refusal(user, approval)
        if refusal:
            raise ApprovalRefused(refusal)
        if approval.status != A.PENDING:
            raise ApprovalRefused(
                f"this request is already {approval.get_status_display().lower()}"
            )
        before = {
            "assignee": approval.assignee.get_username() if approval.assignee else None,
            "group": approval.reviewer_group,
        }
        if assignee is not None:
            refused = approval_refusal(assignee, approval)
            if refused:
                raise ApprovalRefused(
                    f"{assignee.get_username()} cannot decide this request: {refused}"
                )
            approval.assignee = assignee
            people, groups = [assignee], []
        else:
            if not _decider_group(group):
                raise ApprovalRefused(f"{group} is not a group whose members decide approvals")
            approval.reviewer_group = group
            approval.assignee = None
            people, groups = [], [group]
        approval.save(update_fields=["assignee", "reviewer_group"])
        audit_record(
            action="approval.reassigned",
            object_type="approval",
            object_id=approval.pk,
            team_id=run.team_id,
            actor=user,
            before=before,
            after={
                "assignee": assignee.get_username() if assignee else None,
                "group": approval.reviewer_group,
                "note": note.strip(),
            },
            run_id=run.pk,
            approval_id=approval.pk,
        )
        to = assignee.get_username() if assignee else group
        approval_notify(
            approval=approval,
            users=[u for u in _recipients(approval, groups=groups, people=people) if u != user],
            subject=f"Approval handed to {to}: {run.workflow.name} (run #{run.pk})",
            body=_mail_body(
                approval,
                f"{user.get_username()} handed this request to {to}"
                + (f": {note.strip()}" if note.strip() else ".")
                + "\n\n",
            ),
        )
    return approval


def approval_comment(*, approval_id: int, user: User, body: str) -> ApprovalComment:
    """Add a remark to a request for everyone who reviews it. A comment is never a verdict and
    changes nothing about the request. Not idempotent: each call adds a comment."""

    body = body.strip()
    if not body:
        raise ApprovalRefused("a comment needs some text", {"body": ["Write your comment."]})
    if len(body) > 4000:
        raise ApprovalRefused("a comment is at most 4000 characters", {"body": ["Shorten it."]})
    with transaction.atomic():
        run, approval = _lock(approval_id)
        if not approval_visible_to(user, approval):
            raise ApprovalRefused("you are not allowed to see this request")
        comment = ApprovalComment.objects.create(request=approval, author=user, body=body)
        audit_record(
            action="approval.commented",
            object_type="approval",
            object_id=approval.pk,
            team_id=run.team_id,
            actor=user,
            after={"comment_id": comment.pk, "body": body},
            run_id=run.pk,
            approval_id=approval.pk,
        )
    return comment


def reviewer_absence_set(
    *, user: User, away_from: Any | None, away_until: Any | None
) -> ReviewerAbsence | None:
    """Set (both dates) or clear (neither) ``user``'s out-of-office. Idempotent."""
    if (away_from is None) != (away_until is None):
        raise ApprovalRefused("give both dates, or neither to clear")
    if away_from is not None and away_until is not None and away_until < away_from:
        raise ApprovalRefused("the last day away comes before the first")
    with transaction.atomic():
        current = ReviewerAbsence.objects.select_for_update().filter(user=user).first()
        before = (
            {"from": current.away_from.isoformat(), "until": current.away_until.isoformat()}
            if current
            else None
        )
        if away_from is None:
            if current:
                current.delete()
            absence = None
        else:
            absence, _ = ReviewerAbsence.objects.update_or_create(
                user=user, defaults={"away_from": away_from, "away_until": away_until}
            )
        after = (
            {"from": absence.away_from.isoformat(), "until": absence.away_until.isoformat()}
            if absence
            else None
        )
        if before != after:
            audit_record(
                action="reviewer.absence_set",
                object_type="user",
                object_id=user.pk,
                actor=user,
                before=before,
                after=after,
            )
    return absence
