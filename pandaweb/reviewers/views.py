from __future__ import annotations

import json
from datetime import time
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from pandaweb.core.http import AuthenticatedRequest
from pandaweb.reviewers import passkeys, push, services
from pandaweb.reviewers.models import SlackIdentity
from pandaweb.reviewers.selectors import preferences_of, reach_of, reach_sentence


def profile_context(user: Any, *, email_error: str = "", email_typed: str = "") -> dict[str, Any]:
    """What the profile page (approvals.views.reviewer_profile) shows of reaching this person:
    what reaches them and where, their e-mail address, Slack, passkeys, notification preferences
    and browser notifications. ``email_typed`` is an address refused with ``email_error``, shown
    again to be corrected."""
    reaches = reach_of(user)
    return {
        "reaches": reaches,
        "reach_sentence": reach_sentence(reaches),
        "reaches_nothing": not any(reach.on for reach in reaches),
        "email_error": email_error,
        "email_value": email_typed if email_error else user.email,
        "identity": SlackIdentity.objects.filter(user=user).first(),
        "slack_configured": bool(settings.SLACK_BOT_TOKEN),
        "passkeys": list(user.passkeys.all()),
        "preference": preferences_of(user),
        "push_key": push.application_server_key(),
        "push_count": user.push_subscriptions.count(),
    }


def email_address_submit(request: AuthenticatedRequest) -> str:
    """Save the address the profile page's e-mail form posted; the refusal ('' when saved)."""
    try:
        address = services.email_address_set(
            user=request.user, address=request.POST.get("email_address", "")
        )
    except services.ReviewerError as refused:
        return f"Not saved: {refused}."
    messages.success(
        request,
        f"Approval requests can now be e-mailed to {address}."
        if address
        else "Your e-mail address is removed: nothing is e-mailed to you.",
    )
    return ""


@require_POST
def slack_code(request: AuthenticatedRequest) -> HttpResponse:
    code = services.slack_link_code_issue(user=request.user)
    messages.info(
        request, f"In Slack, send /pandaweb link {code} within 10 minutes to link your account."
    )
    return redirect("profile")


@require_POST
def slack_unlink(request: AuthenticatedRequest) -> HttpResponse:
    services.slack_identity_unlink(user=request.user)
    messages.success(request, "Your Slack account is no longer linked.")
    return redirect("profile")


@require_POST
def passkey_options(request: AuthenticatedRequest) -> HttpResponse:
    options = passkeys.passkey_registration_options(user=request.user, session=request.session)
    return HttpResponse(options, content_type="application/json")


@require_POST
def passkey_register(request: AuthenticatedRequest) -> HttpResponse:
    try:
        data = json.loads(request.body)
        passkey = passkeys.passkey_register(
            user=request.user,
            session=request.session,
            credential=json.dumps(data["credential"]),
            name=str(data.get("name") or ""),
        )
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"error": "malformed registration"}, status=400)
    except passkeys.PasskeyError as refused:
        return JsonResponse({"error": str(refused)}, status=400)
    messages.success(request, f"{passkey.name} is registered.")
    return JsonResponse({"id": passkey.pk, "name": passkey.name})


@require_POST
def passkey_delete(request: AuthenticatedRequest, passkey_id: int) -> HttpResponse:
    passkeys.passkey_delete(user=request.user, passkey_id=passkey_id)
    messages.success(request, "The passkey is removed.")
    return redirect("profile")


def _time(text: str) -> time | None:
    return time.fromisoformat(text) if text.strip() else None


@require_POST
def notifications(request: AuthenticatedRequest) -> HttpResponse:
    try:
        services.notification_preference_update(
            user=request.user,
            email=request.POST.get("email") == "on",
            slack=request.POST.get("slack") == "on",
            push=request.POST.get("push") == "on",
            quiet_start=_time(request.POST.get("quiet_start", "")),
            quiet_end=_time(request.POST.get("quiet_end", "")),
            time_zone=request.POST.get("time_zone", "UTC").strip() or "UTC",
        )
    except ValueError:
        messages.error(request, "Not saved: quiet hours are times like 22:00.")
    except services.ReviewerError as refused:
        messages.error(request, f"Not saved: {refused}.")
    else:
        messages.success(request, "Notification preferences saved.")
    return redirect("profile")


@require_POST
def push_subscribe(request: AuthenticatedRequest) -> HttpResponse:
    try:
        data = json.loads(request.body)
        services.push_subscription_save(
            user=request.user,
            endpoint=str(data["endpoint"]),
            p256dh=str(data["keys"]["p256dh"]),
            auth=str(data["keys"]["auth"]),
        )
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"error": "malformed subscription"}, status=400)
    except services.ReviewerError as refused:
        return JsonResponse({"error": str(refused)}, status=400)
    return JsonResponse({"ok": True})
