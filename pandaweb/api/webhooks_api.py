"""Webhook subscriptions and their delivery log over the API: the webhooks pages' services, with
their capability (through the scopes ``webhooks:read`` and ``webhooks:write``) and audit events.

A subscription's signing secret is in one answer only, the one that makes it (creating, or
renewing the secret), as on the dashboard.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.http import HttpRequest
from django.urls import reverse
from ninja import Query, Router, Schema, Status
from pydantic import Field

from pandaweb.api.access import token_with_scope
from pandaweb.api.paging import MAX_PAGE, cursor_decode, cursor_encode
from pandaweb.api.problems import Problem, field_errors
from pandaweb.api.scopes import Scope
from pandaweb.core.models import Team
from pandaweb.webhooks import selectors, services
from pandaweb.webhooks.models import Event, Message, Subscription
from workflows.models import Workflow

router = Router(tags=["webhooks"])

INVALID = "the request is not valid"


class SubscriptionOut(Schema):
    id: int
    name: str
    url: str
    team: str = Field(description="The slug of the team whose events it hears.")
    workflow: str | None = Field(description="The workflow's slug; null: every workflow.")
    events: list[str]
    active: bool
    disabled_reason: str = Field(description="Why it was switched off ('' while active).")
    consecutive_failures: int
    run: int | None = Field(description="A launch's callback: the run it belongs to.")
    created_by: str
    created_at: datetime
    updated_at: datetime
    links: dict[str, str]


class SubscriptionCreatedOut(SubscriptionOut):
    secret: str = Field(description="The signing secret (whsec_…), shown this once.")


class SubscriptionIn(Schema):
    name: str = Field(description="Who receives it, e.g. “ERP invoices”.")
    url: str = Field(description="http:// or https://; redirects are not followed.")
    events: list[Event]
    workflow: str | None = Field(None, description="A workflow's slug; null: every workflow.")
    team: str | None = Field(
        None,
        description="The slug of the team whose events it hears; null: the workflow's, or your "
        "only team.",
    )


class SubscriptionChangeIn(Schema):
    name: str | None = None
    url: str | None = None
    events: list[Event] | None = None
    workflow: str | None = Field(None, description="A workflow's slug; null: every workflow.")
    active: bool | None = Field(None, description="false switches it off, true back on.")


class SecretOut(Schema):
    subscription: int
    secret: str = Field(description="The new signing secret (whsec_…), shown this once.")


class AttemptOut(Schema):
    started_at: datetime
    duration_ms: int
    status_code: int | None
    error: str
    ok: bool
    manual: bool = Field(description="Sent again by a person rather than by the schedule.")


class DeliveryOut(Schema):
    id: int
    msg_id: str = Field(description="The webhook-id header: the same on every attempt.")
    subscription: int
    subscription_name: str
    event: str
    status: str
    attempts: int
    next_attempt_at: datetime
    delivered_at: datetime | None
    last_status_code: int | None
    last_error: str
    created_at: datetime
    links: dict[str, str]


class DeliveryDetailOut(DeliveryOut):
    payload: dict[str, Any]
    attempts_made: list[AttemptOut]


class DeliveryPage(Schema):
    items: list[DeliveryOut]
    next_cursor: str | None


def _url(name: str, **kwargs: Any) -> str:
    return reverse(f"api:{name}", kwargs=kwargs)


def _subscription_out(subscription: Subscription) -> dict[str, Any]:
    return {
        "id": subscription.pk,
        "name": subscription.name,
        "url": subscription.url,
        "team": subscription.team.slug,
        "workflow": subscription.workflow.slug if subscription.workflow else None,
        "events": list(subscription.events),
        "active": subscription.active,
        "disabled_reason": subscription.disabled_reason,
        "consecutive_failures": subscription.consecutive_failures,
        "run": subscription.run_id,
        "created_by": subscription.created_by.get_username(),
        "created_at": subscription.created_at,
        "updated_at": subscription.updated_at,
        "links": {
            "self": _url("webhook_get", subscription_id=subscription.pk),
            "deliveries": _url("webhook_deliveries") + f"?subscription={subscription.pk}",
            "page": reverse("webhooks:detail", kwargs={"subscription_id": subscription.pk}),
        },
    }


def _delivery_out(message: Message) -> dict[str, Any]:
    return {
        "id": message.pk,
        "msg_id": message.msg_id,
        "subscription": message.subscription_id,
        "subscription_name": message.subscription.name,
        "event": message.event,
        "status": message.status,
        "attempts": message.attempts,
        "next_attempt_at": message.next_attempt_at,
        "delivered_at": message.delivered_at,
        "last_status_code": message.last_status_code,
        "last_error": message.last_error,
        "created_at": message.created_at,
        "links": {
            "self": _url("webhook_delivery", message_id=message.pk),
            "redeliver": _url("webhook_redeliver", message_id=message.pk),
        },
    }


def _workflow_id(slug: str | None) -> int | None:
    """The workflow the form would offer under ``slug`` (not archived); None: every workflow."""
    if slug is None:
        return None
    workflow = Workflow.objects.filter(slug=slug).only("pk", "archived").first()
    message = (
        f"no workflow has the slug {slug!r}"
        if workflow is None
        else f"the workflow {slug!r} is archived"
        if workflow.archived
        else ""
    )
    if message:
        raise Problem(422, INVALID, errors=[{"field": "workflow", "message": message}])
    assert workflow is not None
    return workflow.pk


def _refused(exc: services.WebhookError) -> Problem:
    return Problem(422, INVALID, errors=field_errors(exc.field_errors or {"__all__": [str(exc)]}))


# Subscriptions -----------------------------------------------------------------------------------


@router.get(
    "/", response=list[SubscriptionOut], url_name="webhook_list", summary="List subscriptions"
)
def subscription_list(request: HttpRequest) -> list[SubscriptionOut]:
    """The installation's webhook subscriptions, by name (a launch's callback is not among them;
    its deliveries are in the log). Never their secrets. Scope: ``webhooks:read``."""
    context = token_with_scope(request, Scope.WEBHOOKS_READ)
    return [SubscriptionOut(**_subscription_out(s)) for s in selectors.subscriptions(context.user)]


@router.post(
    "/",
    response={201: SubscriptionCreatedOut},
    url_name="webhook_create",
    summary="Make a subscription",
)
def subscription_create(
    request: HttpRequest, payload: SubscriptionIn
) -> Status[SubscriptionCreatedOut]:
    """Send the events chosen, for one workflow or all, to the address, signed (Standard
    Webhooks). The answer carries the signing secret, the only time it is shown: keep it.
    Scope: ``webhooks:write``."""
    context = token_with_scope(request, Scope.WEBHOOKS_WRITE)
    workflow_id = _workflow_id(payload.workflow)
    team_id = None
    if payload.team is not None:
        team_id = Team.objects.filter(slug=payload.team).values_list("pk", flat=True).first()
        if team_id is None:
            message = f"no team has the slug {payload.team!r}"
            raise Problem(422, INVALID, errors=[{"field": "team", "message": message}])
    try:
        subscription, secret = services.subscription_create(
            user=context.user,
            name=payload.name,
            url=payload.url,
            events=[str(e) for e in payload.events],
            workflow_id=workflow_id,
            team_id=team_id,
        )
    except services.WebhookError as exc:
        raise _refused(exc) from None
    made = selectors.subscription_get(subscription.pk, user=context.user)
    return Status(201, SubscriptionCreatedOut(**_subscription_out(made), secret=secret))


@router.get(
    "/{int:subscription_id}",
    response=SubscriptionOut,
    url_name="webhook_get",
    summary="Get a subscription",
)
def subscription_get(request: HttpRequest, subscription_id: int) -> SubscriptionOut:
    """One subscription (or a launch's callback), without its secret. Scope: ``webhooks:read``."""
    context = token_with_scope(request, Scope.WEBHOOKS_READ)
    subscription = selectors.subscription_get(subscription_id, user=context.user)
    return SubscriptionOut(**_subscription_out(subscription))


# Fields whose null means "as it is" would hide a mistake; only the workflow's null means something.
_NOT_NULL = ("name", "url", "events", "active")


@router.patch(
    "/{int:subscription_id}",
    response=SubscriptionOut,
    url_name="webhook_update",
    summary="Change a subscription",
)
def subscription_update(
    request: HttpRequest, subscription_id: int, payload: SubscriptionChangeIn
) -> SubscriptionOut:
    """Change the fields sent only: ``name``, ``url``, ``events``, ``workflow`` (null: every
    workflow) and ``active`` (switching it on again clears its failure count). All or nothing;
    the values it has already change nothing. Scope: ``webhooks:write``."""
    context = token_with_scope(request, Scope.WEBHOOKS_WRITE)
    subscription = selectors.subscription_get(subscription_id, user=context.user)
    sent = payload.model_dump(exclude_unset=True)
    nulls = [name for name in _NOT_NULL if name in sent and sent[name] is None]
    if nulls:
        raise Problem(
            422,
            INVALID,
            errors=[
                {"field": name, "message": "may not be null: leave it out to keep its value"}
                for name in nulls
            ],
        )
    workflow_id = _workflow_id(sent["workflow"]) if "workflow" in sent else subscription.workflow_id
    with transaction.atomic():
        if sent.keys() - {"active"}:
            try:
                services.subscription_update(
                    subscription_id=subscription.pk,
                    user=context.user,
                    name=sent.get("name", subscription.name),
                    url=sent.get("url", subscription.url),
                    events=[str(e) for e in sent.get("events", subscription.events)],
                    workflow_id=workflow_id,
                )
            except services.WebhookError as exc:
                raise _refused(exc) from None
        if "active" in sent:
            services.subscription_set_active(
                subscription_id=subscription.pk, user=context.user, active=sent["active"]
            )
    made = selectors.subscription_get(subscription.pk, user=context.user)
    return SubscriptionOut(**_subscription_out(made))


@router.delete(
    "/{int:subscription_id}",
    response={204: None},
    url_name="webhook_delete",
    summary="Delete a subscription",
)
def subscription_delete(request: HttpRequest, subscription_id: int) -> Status[None]:
    """Delete the subscription and its delivery log (the audit trail keeps what it was); its
    pending messages are never sent. Scope: ``webhooks:write``."""
    context = token_with_scope(request, Scope.WEBHOOKS_WRITE)
    subscription = selectors.subscription_get(subscription_id, user=context.user)
    services.subscription_delete(subscription_id=subscription.pk, user=context.user)
    return Status(204, None)


@router.post(
    "/{int:subscription_id}/secret",
    response=SecretOut,
    url_name="webhook_secret",
    summary="Renew a subscription's secret",
)
def subscription_secret(request: HttpRequest, subscription_id: int) -> SecretOut:
    """A new signing secret, shown in this answer only, as the page's "New secret" button. The
    old one stops at once: what is still pending is signed with the new one.
    Scope: ``webhooks:write``."""
    context = token_with_scope(request, Scope.WEBHOOKS_WRITE)
    subscription = selectors.subscription_get(subscription_id, user=context.user)
    secret = services.subscription_rotate_secret(subscription_id=subscription.pk, user=context.user)
    return SecretOut(subscription=subscription.pk, secret=secret)


# The delivery log --------------------------------------------------------------------------------


@router.get(
    "/deliveries/",
    response=DeliveryPage,
    url_name="webhook_deliveries",
    summary="List deliveries",
)
def delivery_list(
    request: HttpRequest,
    subscription: int | None = None,
    status: Message.Status | None = None,
    limit: int = Query(50, ge=1, le=MAX_PAGE),
    cursor: str = "",
) -> DeliveryPage:
    """The messages sent or to send (callbacks' included), newest first, one page at a time:
    follow ``next_cursor`` (keyset pagination, stable while events are recorded).
    Scope: ``webhooks:read``."""
    context = token_with_scope(request, Scope.WEBHOOKS_READ)
    found = selectors.message_keyset(
        user=context.user,
        subscription_id=subscription,
        status=status.value if status else "",
        before_id=cursor_decode(cursor) if cursor else None,
        limit=limit + 1,
    )
    page = found[:limit]
    return DeliveryPage(
        items=[DeliveryOut(**_delivery_out(m)) for m in page],
        next_cursor=cursor_encode(page[-1].pk) if len(found) > limit else None,
    )


@router.get(
    "/deliveries/{int:message_id}",
    response=DeliveryDetailOut,
    url_name="webhook_delivery",
    summary="Get a delivery",
)
def delivery_get(request: HttpRequest, message_id: int) -> DeliveryDetailOut:
    """The message as it is sent (its JSON body) and every attempt with what the receiver
    answered, newest first. Scope: ``webhooks:read``."""
    context = token_with_scope(request, Scope.WEBHOOKS_READ)
    message = selectors.message_get(message_id, user=context.user)
    return DeliveryDetailOut(
        **_delivery_out(message),
        payload=message.payload,
        attempts_made=[
            AttemptOut(
                started_at=a.started_at,
                duration_ms=a.duration_ms,
                status_code=a.status_code,
                error=a.error,
                ok=a.ok,
                manual=a.manual,
            )
            for a in message.delivery_attempts.all()
        ],
    )


@router.post(
    "/deliveries/{int:message_id}/redeliver",
    response={202: DeliveryOut},
    url_name="webhook_redeliver",
    summary="Send a delivery again",
)
def delivery_redeliver(request: HttpRequest, message_id: int) -> Status[DeliveryOut]:
    """Queue the message for sending again now, whatever became of it, as the delivery page's
    button: the same ``webhook-id``, through the outbox (202; the attempt appears in the
    delivery's ``attempts_made`` once made). Scope: ``webhooks:write``."""
    context = token_with_scope(request, Scope.WEBHOOKS_WRITE)
    message = selectors.message_get(message_id, user=context.user)
    services.message_redeliver(message_id=message.pk, user=context.user)
    return Status(
        202, DeliveryOut(**_delivery_out(selectors.message_get(message.pk, user=context.user)))
    )
