"""Slack's side door: signed callbacks (buttons, the reject modal, the link command), the card's
picture at a signed link, and a preview of the card for admins."""

from __future__ import annotations

import json

from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from approvals import selectors, slack, slack_callbacks
from approvals.models import ApprovalRequest
from pandaweb.core.http import AuthenticatedRequest
from pandaweb.core.permissions import capability_required
from pandaweb.core.roles import Capability
from pandaweb.reviewers import services as reviewers


def _verified(request: HttpRequest) -> HttpResponse | None:
    try:
        slack_callbacks.verify_callback(body=request.body, headers=dict(request.headers))
    except slack_callbacks.CallbackRefused as refused:
        # Nobody trustworthy to answer in Slack: the sender is not (or no longer) Slack.
        return HttpResponse(f"Refused: {refused}.", status=401, content_type="text/plain")
    return None


@csrf_exempt
@login_not_required
@require_POST
def slack_interactions(request: HttpRequest) -> HttpResponse:
    refused = _verified(request)
    if refused:
        return refused
    try:
        payload = json.loads(request.POST.get("payload", ""))
    except ValueError:
        return HttpResponse("Malformed payload.", status=400, content_type="text/plain")
    if payload.get("type") == "block_actions":
        slack_callbacks.handle_block_action(payload)
    elif payload.get("type") == "view_submission":
        answer = slack_callbacks.handle_view_submission(payload)
        if answer:
            return JsonResponse(answer)
    return HttpResponse(status=200)


@csrf_exempt
@login_not_required
@require_POST
def slack_commands(request: HttpRequest) -> HttpResponse:
    """``/pandaweb link CODE``: Slack signs who sent it, the code says which pandaweb user."""
    refused = _verified(request)
    if refused:
        return refused
    words = request.POST.get("text", "").split()
    if len(words) != 2 or words[0].lower() != "link":
        text = "Use `/pandaweb link CODE` with the code from your pandaweb profile page."
    else:
        try:
            user = reviewers.slack_identity_link(
                team_id=request.POST.get("team_id", ""),
                slack_user_id=request.POST.get("user_id", ""),
                code=words[1],
            )
            text = f"Linked: your Slack account now decides as pandaweb user {user.get_username()}."
        except reviewers.ReviewerError as refused_link:
            text = f"Not linked: {refused_link}."
    return JsonResponse({"response_type": "ephemeral", "text": text})


@login_not_required
@require_GET
def slack_card_image(request: HttpRequest, token: str) -> HttpResponse:
    approval_id = slack.card_image_approval(token)
    approval = ApprovalRequest.objects.filter(pk=approval_id).first() if approval_id else None
    if approval is None:
        return HttpResponse("This link is invalid or expired.", status=404)
    response = HttpResponse(slack.card_image(approval), content_type="image/png")
    response["Cache-Control"] = "private, max-age=300"
    return response


@require_GET
@capability_required(Capability.VIEW_SYSTEM)
def slack_card_preview(request: AuthenticatedRequest, approval_id: int) -> HttpResponse:
    """What the request's Slack card looks like now (admins checking the integration)."""
    approval = selectors.approval_get(approval_id, user=request.user)
    fallback, blocks = slack.card_blocks(approval)
    return render(
        request,
        "approvals/slack_preview.html",
        {"approval": approval, "fallback": fallback, "blocks": blocks},
    )
