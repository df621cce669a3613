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
from typing import Any

from celery.utils.nodenames import worker_direct
from django.conf import settings
from django.contrib.auth.models import User
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from approvals.events import publish_pending_changed
from approvals.models import ApprovalDecision, ApprovalRequest
from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record
from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability, Role
from sessions.models import Run

logger = logging.getLogger(__name__)

A = ApprovalRequest.Status


class ApprovalRefused(Exception):
    """The decision is not allowed or no longer possible; the message is for people."""

    def __init__(self, message: str, field_errors: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.field_errors = field_errors or {}


# Opening -----------------------------------------------------------------------------------------


def approval_open(*, run: Run, gate: Any, previous: ApprovalRequest | None) -> ApprovalRequest:
    """Freeze the evidence of a gate into a pending request (inside the caller's transaction,
    with ``run`` locked). ``previous`` is the approved request whose page changed since."""
    from sessions import observation as observing
    from sessions.services import run_files_dir

    document = run.version.document or {}
    policy = document.get("settings", {}).get("approval", {})
    evidence = gate.evidence
    directory = run_files_dir(run.pk) / "approvals"
    directory.mkdir(parents=True, exist_ok=True)
    number = run.approvals.count() + 1
    stem = f"{number:02d}-{evidence['step_id']}"
    screenshot_path = directory / f"{stem}.png"
    screenshot_path.write_bytes(gate.screenshot)
    box = (evidence.get("target") or {}).get("box")
    outlined = (
        observing.outline_target(gate.screenshot, (box["x"], box["y"], box["width"], box["height"]))
        if box
        else gate.screenshot
    )
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
        quorum=int(policy.get("quorum", 1)),
        author_may_approve=bool(policy.get("author_may_approve", False)),
        reviewer_group=document.get("reviewer_group", Role.REVIEWERS.value),
        expires_at=timezone.now() + timedelta(minutes=int(policy.get("expiry_minutes", 60))),
        previous=previous,
    )
    if previous is not None:
        previous.status = A.VOIDED
        previous.reason = "the page changed since approval: " + "; ".join(gate.changes)
        previous.save(update_fields=["status", "reason"])
    audit_record(
        action="approval.requested",
        object_type="approval",
        object_id=approval.pk,
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
    publish_pending_changed()
    _notify_reviewers(approval)
    return approval


def evidence_hash(evidence: dict[str, Any]) -> str:
    canonical = json.dumps(evidence, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _notify_reviewers(approval: ApprovalRequest) -> None:
    recipients = sorted(
        {
            email
            for email in User.objects.filter(
                groups__name__in=[approval.reviewer_group, Role.ADMINS.value], is_active=True
            ).values_list("email", flat=True)
            if email
        }
    )
    if not recipients:
        return
    run = approval.run
    subject = f"Approval needed: {run.workflow.name} (run #{run.pk})"
    body = (
        f"{approval.action}\n\nRequested by run #{run.pk}, launched by "
        f"{run.launched_by.get_username()}.\nDecide before {approval.expires_at:%Y-%m-%d %H:%M} "
        f"UTC: {settings.PANDAWEB_BASE_URL}/approvals/{approval.pk}/\n"
    )

    def send() -> None:
        try:
            send_mail(subject, body, None, recipients)
        except Exception:  # a mail outage must not undo the gate
            logger.exception("could not e-mail reviewers about approval %s", approval.pk)

    transaction.on_commit(send)


# Deciding ----------------------------------------------------------------------------------------


def approval_refusal(user: User, approval: ApprovalRequest) -> str | None:
    """Why ``user`` may not decide ``approval`` (None when they may)."""
    run = approval.run
    if not user_can(user, Capability.DECIDE_APPROVALS):
        return "you are not allowed to decide approvals"
    admin = user.is_superuser or user.groups.filter(name=Role.ADMINS.value).exists()
    if not admin and not user.groups.filter(name=approval.reviewer_group).exists():
        return f"only members of {approval.reviewer_group} decide this workflow's approvals"
    if run.launched_by_id == user.pk:
        return "you launched this run: someone else has to approve it"
    if run.version.author_id == user.pk and not approval.author_may_approve:
        return "you wrote this version of the workflow, which does not let its author approve"
    return None


def approval_decide(
    *,
    approval_id: int,
    user: User,
    approve: bool,
    reason: str = "",
    evidence_sha256: str,
) -> ApprovalRequest:
    """Record one reviewer's verdict; the request closes at quorum or at the first rejection.

    ``evidence_sha256`` is the hash of the evidence the reviewer was shown: a verdict on other
    evidence is refused. A reviewer's second verdict on the same request changes nothing.
    """
    reason = reason.strip()
    if not approve and not reason:
        raise ApprovalRefused(
            "a rejection needs a reason", {"reason": ["Say why you reject this action."]}
        )
    run_id = ApprovalRequest.objects.values_list("run_id", flat=True).get(pk=approval_id)
    continue_on: dict[str, Any] | None = None
    destroy: dict[str, Any] | None = None
    with transaction.atomic():
        from sessions.services import lock_run

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
            ApprovalDecision.objects.create(
                request=approval,
                reviewer=user,
                verdict=ApprovalDecision.Verdict.APPROVE
                if approve
                else ApprovalDecision.Verdict.REJECT,
                reason=reason,
                evidence_sha256=approval.evidence_sha256,
            )
            approvals = approval.decisions.filter(verdict=ApprovalDecision.Verdict.APPROVE).count()
            audit_record(
                action="approval.decided",
                object_type="approval",
                object_id=approval.pk,
                actor=user,
                after={
                    "verdict": "approve" if approve else "reject",
                    "reason": reason,
                    "evidence_sha256": approval.evidence_sha256,
                    "approvals": approvals,
                    "quorum": approval.quorum,
                },
                run_id=run.pk,
                approval_id=approval.pk,
            )
            if not approve:
                destroy = _close_run(
                    run, approval, A.REJECTED, reason=f"rejected by {user.get_username()}: {reason}"
                )
            elif approvals >= approval.quorum:
                continue_on = _approve(run, approval)
        if destroy is None and continue_on is None and not expired_now:
            return approval
    if destroy:
        from sessions.services import destroy_sandbox

        destroy_sandbox(destroy)
    if expired_now:
        raise ApprovalRefused("this request is already expired")
    if continue_on is not None:
        _dispatch_continuation(run.pk, approval.pk, continue_on)
    return approval


def _approve(run: Run, approval: ApprovalRequest) -> dict[str, Any]:
    from sessions.services import transition

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
    publish_pending_changed()
    return dict((run.sandbox or {}).get("owner") or {})


def _dispatch_continuation(run_id: int, approval_id: int, owner: dict[str, Any]) -> None:
    from pandaweb.core.dispatch import dispatch
    from sessions.tasks import run_continue_task

    node = owner.get("node")
    # The continuation must reach the process that holds the browser's proxy: that Celery node's
    # own queue, or this process's pool in the embedded default (node is empty there).
    queue = worker_direct(node).name if node else None
    dispatch(run_continue_task, queue=queue, run_id=run_id, approval_id=approval_id)


def _close_run(
    run: Run, approval: ApprovalRequest, status: str, *, reason: str
) -> dict[str, Any] | None:
    """End a waiting run with its request (rejected or expired); returns the sandbox to destroy."""
    from sessions.services import transition

    approval.status = status
    approval.decided_at = timezone.now()
    approval.reason = reason
    approval.save(update_fields=["status", "decided_at", "reason"])
    sandbox = run.sandbox
    if run.status == Run.Status.AWAITING_APPROVAL:
        transition(run, Run.Status.CANCELLED, reason=reason, sandbox=None)
    publish_pending_changed()
    return sandbox


def _expire(run: Run, approval: ApprovalRequest) -> dict[str, Any] | None:
    sandbox = _close_run(run, approval, A.EXPIRED, reason="approval expired")
    audit_record(
        action="approval.expired",
        object_type="approval",
        object_id=approval.pk,
        after={"expired_at": approval.expires_at.isoformat()},
        run_id=run.pk,
        approval_id=approval.pk,
    )
    return sandbox


def approval_expire_due() -> list[int]:
    """Expire every pending request past its deadline: the run is cancelled, its browser
    destroyed. Fails closed: nothing ever continues on its own."""
    from sessions.services import destroy_sandbox, lock_run

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
    """Void the pending request of a run that stops waiting for another reason (inside the
    caller's transaction, ``run`` locked)."""
    for approval in ApprovalRequest.objects.select_for_update().filter(run=run, status=A.PENDING):
        approval.status = A.VOIDED
        approval.decided_at = timezone.now()
        approval.reason = reason
        approval.save(update_fields=["status", "decided_at", "reason"])
        audit_record(
            action="approval.voided",
            object_type="approval",
            object_id=approval.pk,
            after={"reason": reason},
            run_id=run.pk,
            approval_id=approval.pk,
        )
        publish_pending_changed()
