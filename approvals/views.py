from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.text import capfirst
from django.views.decorators.http import require_GET, require_POST

from approvals import selectors, services
from approvals.models import ApprovalDecision, ApprovalRequest
from pandaweb.core.http import AuthenticatedRequest
from pandaweb.core.permissions import capability_required
from pandaweb.core.roles import Capability

A = ApprovalRequest.Status


@require_GET
@capability_required(Capability.VIEW_APPROVALS)
def approval_index(request: AuthenticatedRequest) -> HttpResponse:
    workflow = request.GET.get("workflow", "").strip()
    status = "all" if request.GET.get("status") == "all" else "pending"
    context = {
        "requests": selectors.approval_queue(
            workflow_slug=workflow, pending_only=status == "pending"
        ),
        "workflows": selectors.approval_queue_workflows(),
        "workflow": workflow,
        "status": status,
    }
    template = "approvals/index.html#queue" if request.htmx else "approvals/index.html"
    return render(request, template, context)


@require_GET
@capability_required(Capability.VIEW_APPROVALS)
def approval_detail(request: AuthenticatedRequest, approval_id: int) -> HttpResponse:
    approval = selectors.approval_get(approval_id)
    return render(request, "approvals/detail.html", _detail_context(request, approval))


@require_POST
@capability_required(Capability.DECIDE_APPROVALS)
def approval_decide(request: AuthenticatedRequest, approval_id: int) -> HttpResponse:
    """Approve or reject: the decision panel for htmx, back to the page without JavaScript."""
    approval = selectors.approval_get(approval_id)
    verdict = request.POST.get("verdict", "")
    if verdict not in ApprovalDecision.Verdict.values:
        return HttpResponseBadRequest("verdict must be approve or reject")
    approve = verdict == ApprovalDecision.Verdict.APPROVE
    reason = request.POST.get("reason", "")
    try:
        decided = services.approval_decide(
            approval_id=approval.pk,
            user=request.user,
            approve=approve,
            reason=reason,
            evidence_sha256=request.POST.get("evidence_sha256", ""),
        )
    except services.ApprovalRefused as refused:
        error = _sentence(str(refused))
        approval = selectors.approval_get(approval.pk)  # it may have moved on meanwhile
        if request.htmx:
            # 200, so htmx swaps the panel with the refusal in place.
            context = _panel_context(
                request, approval, error=error, field_errors=refused.field_errors, reason=reason
            )
            return render(request, "approvals/detail.html#decision", context)
        messages.error(request, f"Not recorded. {error}")
        if refused.field_errors:
            # Like an invalid form: the page again, with the reason field's error and its text.
            context = _detail_context(
                request, approval, field_errors=refused.field_errors, reason=reason
            )
            return render(request, "approvals/detail.html", context)
        return redirect("approvals:detail", approval_id=approval.pk)
    notice = _outcome(decided, approve=approve)
    if request.htmx:
        approval = selectors.approval_get(approval.pk)
        return render(
            request,
            "approvals/detail.html#decision",
            _panel_context(request, approval, notice=notice),
        )
    messages.success(request, notice)
    return redirect("approvals:detail", approval_id=approval.pk)


def _sentence(text: str) -> str:
    text = capfirst(text.strip()) or ""
    return text if text.endswith((".", "!", "?")) else f"{text}."


def _outcome(approval: ApprovalRequest, *, approve: bool) -> str:
    run = f"run #{approval.run_id}"
    if approval.status == A.APPROVED:
        return f"Approved. {capfirst(run)} continues with the action."
    if approval.status == A.REJECTED:
        return f"Rejected. {capfirst(run)} is cancelled; nothing was submitted."
    if approval.status == A.EXPIRED:
        return f"Too late: the request had expired, so {run} is cancelled."
    if approve:
        given = sum(
            1
            for verdict in approval.decisions.values_list("verdict", flat=True)
            if verdict == ApprovalDecision.Verdict.APPROVE
        )
        return f"Your approval is recorded ({given} of {approval.quorum}); waiting for the others."
    return "Your decision is recorded."


def _panel_context(
    request: AuthenticatedRequest,
    approval: ApprovalRequest,
    *,
    notice: str = "",
    error: str = "",
    field_errors: dict[str, list[str]] | None = None,
    reason: str = "",
) -> dict[str, Any]:
    """What the decision panel shows: the state, the verdicts so far, and the buttons, or why
    this person may not decide."""
    decisions = list(selectors.approval_decisions(approval))
    pending = approval.status == A.PENDING
    return {
        "approval": approval,
        "run": approval.run,
        "decisions": decisions,
        "approvals_given": sum(
            1 for d in decisions if d.verdict == ApprovalDecision.Verdict.APPROVE
        ),
        "my_decision": next((d for d in decisions if d.reviewer_id == request.user.pk), None),
        "overdue": pending and approval.expires_at <= timezone.now(),
        "refusal": _sentence(refusal)
        if pending and (refusal := services.approval_refusal(request.user, approval))
        else "",
        "successor": selectors.approval_successor(approval),
        "notice": notice,
        "error": error,
        "field_errors": field_errors or {},
        "reason": reason,
    }


def _detail_context(
    request: AuthenticatedRequest, approval: ApprovalRequest, **panel: Any
) -> dict[str, Any]:
    run = approval.run
    evidence = approval.evidence or {}
    return {
        **_panel_context(request, approval, **panel),
        "evidence": evidence,
        "target": evidence.get("target") or {},
        "observation": evidence.get("observation") or {},
        "values": selectors.approval_values(approval),
        "steps": selectors.approval_timeline(run),
    }
