from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse, HttpResponseBadRequest, HttpResponseNotAllowed
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.text import capfirst
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRefresh

from approvals import questions, selectors, services
from approvals.closeup import approval_target_crop
from approvals.forms import AwayForm
from approvals.models import ApprovalDecision, ApprovalRequest, ReviewerAbsence
from approvals.passkeys import passkey_reason, passkey_required
from approvals.policy import approval_refusal
from pandaweb.core.http import AuthenticatedRequest
from pandaweb.core.permissions import capability_required, user_can
from pandaweb.core.roles import Capability
from pandaweb.reviewers.views import email_address_submit, profile_context

A = ApprovalRequest.Status


@require_POST
@capability_required(Capability.VIEW_RUNS)
def question_answer(request: AuthenticatedRequest, question_id: int) -> HttpResponse:
    """Answer a run's question from its page; back to the run page, with the refusal if any."""
    run_id = selectors.question_run_id(question_id, user=request.user)
    try:
        questions.question_answer(
            question_id=question_id, user=request.user, answer=request.POST.get("answer", "")
        )
    except questions.QuestionRefused as exc:
        messages.error(request, f"Your answer was not taken: {exc}.")
    else:
        messages.info(request, "Answer sent: the run goes on.")
    if request.htmx:
        return HttpResponseClientRefresh()
    return redirect("runs:detail", run_id=run_id)


@require_GET
@capability_required(Capability.VIEW_APPROVALS)
def approval_index(request: AuthenticatedRequest) -> HttpResponse:
    workflow = request.GET.get("workflow", "").strip()
    status = "all" if request.GET.get("status") == "all" else "pending"
    context = {
        "requests": selectors.approval_queue(
            user=request.user, workflow_slug=workflow, pending_only=status == "pending"
        ),
        "workflows": selectors.approval_queue_workflows(request.user),
        "workflow": workflow,
        "status": status,
        "questions": selectors.questions_for(request.user),
    }
    template = "approvals/index.html#queue" if request.htmx else "approvals/index.html"
    return render(request, template, context)


@require_GET
@capability_required(Capability.VIEW_RUNS)
def approval_detail(request: AuthenticatedRequest, approval_id: int) -> HttpResponse:
    """The decision page. The person who launched the run may watch the request of their own
    run without seeing the queue: read-only, since the policy refuses their verdict anyway."""
    approval = selectors.approval_get(approval_id, user=request.user)
    if not selectors.approval_visible_to(request.user, approval):
        raise PermissionDenied("This page needs the capability 'view_approvals'.")
    return render(request, "approvals/detail.html", _detail_context(request, approval))


@require_POST
@capability_required(Capability.DECIDE_APPROVALS)
def approval_decide(request: AuthenticatedRequest, approval_id: int) -> HttpResponse:
    """Approve or reject: the decision panel for htmx, back to the page without JavaScript."""
    approval = selectors.approval_get(approval_id, user=request.user)
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
            passkey_assertion=request.POST.get("passkey_assertion", ""),
        )
    except services.ApprovalRefused as refused:
        error = _sentence(str(refused))
        # It may have moved on meanwhile.
        approval = selectors.approval_get(approval.pk, user=request.user)
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
        approval = selectors.approval_get(approval.pk, user=request.user)
        response = render(
            request,
            "approvals/detail.html#decision",
            _panel_context(request, approval, notice=notice),
        )
        # The outcome goes to the top of the page, and the page with it; a refusal stays in
        # place, beside the button that was tapped.
        response["HX-Reswap"] = "outerHTML show:window:top"
        return response
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
        if pending and (refusal := approval_refusal(request.user, approval))
        else "",
        "successor": selectors.approval_successor(approval),
        "passkey": passkey_reason(approval) if pending else "",
        "has_passkey": pending and request.user.passkeys.exists(),
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
    people, groups = (
        selectors.approval_handover_choices(approval)
        if (approval.status == A.PENDING and not approval_refusal(request.user, approval))
        else ([], [])
    )
    return {
        **_panel_context(request, approval, **panel),
        "target_crop": approval_target_crop(approval),
        "history": selectors.approval_history(approval),
        "handover_people": [p for p in people if p.pk != request.user.pk],
        "handover_groups": groups,
        "evidence": evidence,
        "target": evidence.get("target") or {},
        "observation": evidence.get("observation") or {},
        "values": selectors.approval_values(approval),
        "steps": selectors.approval_timeline(run),
        "can_see_queue": user_can(request.user, Capability.VIEW_APPROVALS),
        "passkey_required": passkey_required(approval),
    }


@require_POST
@capability_required(Capability.VIEW_RUNS)
def approval_comment(request: AuthenticatedRequest, approval_id: int) -> HttpResponse:
    """A remark for the other reviewers, shown in the request's timeline; never a verdict."""
    approval = selectors.approval_get(approval_id, user=request.user)
    if not selectors.approval_visible_to(request.user, approval):
        raise PermissionDenied("This page needs the capability 'view_approvals'.")
    try:
        services.approval_comment(
            approval_id=approval.pk, user=request.user, body=request.POST.get("body", "")
        )
    except services.ApprovalRefused as refused:
        messages.error(request, f"Not recorded. {_sentence(str(refused))}")
    else:
        messages.success(request, "Your comment is added to the timeline.")
    return redirect(reverse("approvals:detail", args=[approval.pk]) + "#comments")


@require_POST
@capability_required(Capability.DECIDE_APPROVALS)
def approval_reassign(request: AuthenticatedRequest, approval_id: int) -> HttpResponse:
    """Hand the request to one person or one group ("user:<id>" or "group:<name>")."""
    approval = selectors.approval_get(approval_id, user=request.user)
    to = request.POST.get("to", "")
    kind, _, value = to.partition(":")
    assignee = None
    if kind == "user" and value.isdigit():
        assignee = User.objects.filter(pk=int(value), is_active=True).first()
    if (
        (kind == "user" and assignee is None)
        or (kind == "group" and not value)
        or (kind not in ("user", "group"))
    ):
        messages.error(request, "Not handed over. Choose a person or a group.")
        return redirect("approvals:detail", approval_id=approval.pk)
    try:
        services.approval_reassign(
            approval_id=approval.pk,
            user=request.user,
            assignee=assignee,
            group=value if kind == "group" else "",
            note=request.POST.get("note", ""),
        )
    except services.ApprovalRefused as refused:
        messages.error(request, f"Not handed over. {_sentence(str(refused))}")
    else:
        name = assignee.get_username() if assignee else value
        messages.success(request, f"Handed over to {name}; they have been told.")
    return redirect("approvals:detail", approval_id=approval.pk)


@login_required
def reviewer_profile(request: AuthenticatedRequest) -> HttpResponse:
    """The signed-in person's page: their roles, their out-of-office, and how pandaweb reaches them
    (their e-mail address, Slack, passkeys, notifications: pandaweb.reviewers). Its two forms
    post here: the out-of-office dates, and the e-mail address."""
    current = ReviewerAbsence.objects.filter(user=request.user).first()
    initial = {"away_from": current.away_from, "away_until": current.away_until} if current else {}
    if request.method == "POST" and "email_address" in request.POST:
        refusal = email_address_submit(request)
        if not refusal:
            return redirect("profile")
        reach = profile_context(
            request.user, email_error=refusal, email_typed=request.POST["email_address"]
        )
        return render(
            request,
            "reviewers/profile.html",
            {"form": AwayForm(initial=initial), "absence": current, **reach},
            status=400,
        )
    form = AwayForm(request.POST or None, initial=initial)
    if request.method == "POST":
        if form.is_valid():
            try:
                absence = services.reviewer_absence_set(
                    user=request.user,
                    away_from=form.cleaned_data["away_from"],
                    away_until=form.cleaned_data["away_until"],
                )
            except services.ApprovalRefused as refused:
                form.add_error(None, _sentence(str(refused)))
            else:
                messages.success(
                    request,
                    f"Out of office from {absence.away_from:%Y-%m-%d} to "
                    f"{absence.away_until:%Y-%m-%d}: no approval notifications then."
                    if absence
                    else "You are not marked out of office.",
                )
                return redirect("profile")
    elif request.method != "GET":
        return HttpResponseNotAllowed(["GET", "POST"])
    return render(
        request,
        "reviewers/profile.html",
        {"form": form, "absence": current, **profile_context(request.user)},
    )
