from __future__ import annotations

import json

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from pandaweb.core.http import AuthenticatedRequest
from pandaweb.core.permissions import capability_required, sees_several_teams
from pandaweb.core.roles import Capability
from pandaweb.webhooks import selectors, services
from pandaweb.webhooks.forms import SubscriptionForm
from pandaweb.webhooks.models import Message

# Webhooks send run outcomes to other systems: an Admins' matter (the only role with this).
ADMIN = Capability.VIEW_SYSTEM


def _add_errors(form: SubscriptionForm, exc: services.WebhookError) -> None:
    if not exc.field_errors:
        form.add_error(None, str(exc))
    for name, errors in exc.field_errors.items():
        for error in errors:
            form.add_error(name if name in form.fields else None, error)


@require_GET
@capability_required(ADMIN)
def subscription_index(request: AuthenticatedRequest) -> HttpResponse:
    context = {
        "subscriptions": selectors.subscriptions(request.user),
        "show_team": sees_several_teams(request.user, ADMIN),
    }
    return render(request, "webhooks/index.html", context)


@require_http_methods(["GET", "POST"])
@capability_required(ADMIN)
def subscription_create(request: AuthenticatedRequest) -> HttpResponse:
    form = SubscriptionForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            subscription, secret = services.subscription_create(
                user=request.user,
                name=data["name"],
                url=data["url"],
                events=data["events"],
                workflow_id=data["workflow"].pk if data["workflow"] else None,
                team_id=data["team"].pk if data["team"] else None,
            )
        except services.WebhookError as exc:
            _add_errors(form, exc)
        else:
            # Rendered, not redirected: the secret is on this one response and nowhere else.
            return render(
                request, "webhooks/secret.html", {"subscription": subscription, "secret": secret}
            )
    return render(request, "webhooks/form.html", {"form": form})


@require_http_methods(["GET", "POST"])
@capability_required(ADMIN)
def subscription_detail(request: AuthenticatedRequest, subscription_id: int) -> HttpResponse:
    subscription = selectors.subscription_get(subscription_id, user=request.user)
    initial = {
        "name": subscription.name,
        "url": subscription.url,
        "workflow": subscription.workflow_id,
        "events": subscription.events,
    }
    form = SubscriptionForm(
        request.POST or None, initial=initial, user=request.user, fixed_team=True
    )
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            services.subscription_update(
                subscription_id=subscription.pk,
                user=request.user,
                name=data["name"],
                url=data["url"],
                events=data["events"],
                workflow_id=data["workflow"].pk if data["workflow"] else None,
            )
        except services.WebhookError as exc:
            _add_errors(form, exc)
        else:
            messages.success(request, "Subscription saved.")
            return redirect("webhooks:detail", subscription_id=subscription.pk)
    recent = selectors.messages(user=request.user, subscription_id=subscription.pk)[:20]
    context = {"subscription": subscription, "form": form, "recent": recent}
    return render(request, "webhooks/detail.html", context)


@require_POST
@capability_required(ADMIN)
def subscription_active(request: AuthenticatedRequest, subscription_id: int) -> HttpResponse:
    subscription = selectors.subscription_get(subscription_id, user=request.user)
    active = request.POST.get("active") == "1"
    services.subscription_set_active(
        subscription_id=subscription.pk, user=request.user, active=active
    )
    messages.success(
        request, "Subscription switched on." if active else "Subscription switched off."
    )
    return redirect("webhooks:detail", subscription_id=subscription.pk)


@require_POST
@capability_required(ADMIN)
def subscription_secret(request: AuthenticatedRequest, subscription_id: int) -> HttpResponse:
    subscription = selectors.subscription_get(subscription_id, user=request.user)
    secret = services.subscription_rotate_secret(subscription_id=subscription.pk, user=request.user)
    context = {"subscription": subscription, "secret": secret, "rotated": True}
    return render(request, "webhooks/secret.html", context)


@require_GET
@capability_required(ADMIN)
def delivery_index(request: AuthenticatedRequest) -> HttpResponse:
    try:
        subscription_id = int(request.GET.get("subscription", "") or 0)
    except ValueError:
        subscription_id = 0
    status = request.GET.get("status", "")
    found = selectors.messages(
        user=request.user, subscription_id=subscription_id or None, status=status
    )
    page = Paginator(found, 50).get_page(request.GET.get("page"))
    context = {
        "page": page,
        "status": status,
        "statuses": Message.Status.choices,
        "subscription_id": subscription_id,
        "subscriptions": selectors.subscriptions(request.user),
    }
    return render(request, "webhooks/deliveries.html", context)


@require_GET
@capability_required(ADMIN)
def delivery_detail(request: AuthenticatedRequest, message_id: int) -> HttpResponse:
    message = selectors.message_get(message_id, user=request.user)
    context = {
        "message": message,
        "attempts": message.delivery_attempts.all(),
        "payload": json.dumps(message.payload, indent=2, ensure_ascii=False),
    }
    return render(request, "webhooks/delivery.html", context)


@require_POST
@capability_required(ADMIN)
def delivery_redeliver(request: AuthenticatedRequest, message_id: int) -> HttpResponse:
    message = selectors.message_get(message_id, user=request.user)
    services.message_redeliver(message_id=message.pk, user=request.user)
    messages.success(request, "Sending it again now; the attempt appears below in a moment.")
    return redirect("webhooks:delivery", message_id=message.pk)
