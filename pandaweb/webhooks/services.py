"""Webhooks: subscriptions, the outbox, and delivery with retries.

An event becomes one ``Message`` row per matching subscription inside the transaction of the
change (``outbox_record``), so a rolled-back change sends nothing and a committed one is never
lost. Workers deliver due messages; a worker claims a message with a conditional update of
``locked_until`` before the POST, so two workers never deliver the same row at once.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import requests
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from standardwebhooks import Webhook

from approvals.models import ApprovalRequest
from pandaweb.audit.services import audit_record
from pandaweb.core.dispatch import dispatch, task_named
from pandaweb.core.models import Team, default_team_id
from pandaweb.core.permissions import teams_where, user_can
from pandaweb.webhooks import payloads
from pandaweb.webhooks.models import Attempt, Event, Message, Subscription
from pandaweb.webhooks.selectors import MANAGE
from sessions.models import Run
from workflows.hosts import HostPatternError, host_allowed, normalize_host, parse_host_pattern
from workflows.models import Workflow
from workflows.services.credentials import vault

logger = logging.getLogger(__name__)

# Which run status announces which event; statuses not listed (running, …) announce nothing.
RUN_EVENTS: dict[str, str] = {
    Run.Status.SUCCEEDED: Event.RUN_FINISHED,
    Run.Status.FAILED: Event.RUN_FAILED,
    Run.Status.EXPIRED: Event.RUN_FAILED,
    Run.Status.INTERRUPTED: Event.RUN_FAILED,
    Run.Status.CANCELLED: Event.RUN_FAILED,
    Run.Status.NEEDS_RECONCILIATION: Event.RUN_NEEDS_RECONCILIATION,
}
APPROVAL_DECIDED_STATUSES = frozenset(
    {
        ApprovalRequest.Status.APPROVED,
        ApprovalRequest.Status.REJECTED,
        ApprovalRequest.Status.EXPIRED,
    }
)
USER_AGENT = "pandaweb-webhooks/1"


class WebhookError(Exception):
    def __init__(self, message: str, field_errors: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.field_errors = field_errors or {}


# Secrets -----------------------------------------------------------------------------------------


def secret_generate() -> str:
    """A Standard Webhooks secret: ``whsec_`` and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def subscription_secret(subscription: Subscription) -> str:
    return vault().open(subscription.secret_sealed)["secret"]


# Subscriptions -----------------------------------------------------------------------------------


# What the form's address field (a URLField) checks.
_URL_FIELD_RULE = URLValidator(schemes=["http", "https"])


def _url_problem(url: str) -> str:
    if not url.lower().startswith(("http://", "https://")):
        return "The address must start with http:// or https://."
    if len(url) > 2000:
        return "Use an address of at most 2000 characters."
    return ""


def _check(*, name: str, url: str, events: list[str]) -> tuple[str, str, list[str]]:
    """The subscription form's rules, so that every adapter refuses what the form refuses."""
    errors: dict[str, list[str]] = {}
    name = name.strip()
    if not name:
        errors["name"] = ["Give the subscription a name."]
    elif len(name) > 200:
        errors["name"] = ["Use a name of at most 200 characters."]
    url = url.strip()
    if problem := _url_problem(url):
        errors["url"] = [problem]
    else:
        try:
            _URL_FIELD_RULE(url)
        except ValidationError:
            errors["url"] = ["The address is not a valid URL."]
    known = {e.value for e in Event}
    chosen = [e for e in events if e in known]
    if not chosen or len(chosen) != len(events):
        errors["events"] = ["Choose at least one of the listed events."]
    if errors:
        raise WebhookError("the subscription is not valid", errors)
    return name, url, sorted(set(chosen))


def _facts(subscription: Subscription) -> dict[str, Any]:
    return {
        "name": subscription.name,
        "team": subscription.team.slug,
        "url": subscription.url,
        "workflow": subscription.workflow.slug if subscription.workflow else None,
        "events": list(subscription.events),
        "active": subscription.active,
    }


def _team_for(*, user: User, team_id: int | None, workflow_id: int | None) -> int:
    """The team a new subscription hears: the one named (one of ``user``'s), else its
    workflow's, else the person's only team; with several, they have to say which."""
    mine = teams_where(user, MANAGE)
    teams = Team.objects.all() if mine is None else Team.objects.filter(pk__in=mine)
    if workflow_id is not None and team_id is None:
        team_id = Workflow.objects.values_list("team_id", flat=True).get(pk=workflow_id)
    if team_id is not None:
        if not teams.filter(pk=team_id).exists():
            raise WebhookError(
                "you may not make subscriptions for that team",
                {"team": ["Choose one of your teams."]},
            )
        return team_id
    found = list(teams.order_by("name")[:2])
    if len(found) == 1:
        return found[0].pk
    if not found:
        if mine is None:  # no team set up yet: everything is the default team's
            return default_team_id()
        raise WebhookError("you hold no team to make a subscription for")
    names = ", ".join(teams.order_by("name").values_list("name", flat=True)[:20])
    raise WebhookError(
        "say which team the subscription is for",
        {"team": [f"Choose the team whose events it hears: {names}."]},
    )


def subscription_create(
    *,
    user: User,
    name: str,
    url: str,
    events: list[str],
    workflow_id: int | None,
    team_id: int | None = None,
) -> tuple[Subscription, str]:
    """Make a subscription and return it with its secret, which is shown this once. It hears
    only its team's events (``_team_for``: the team named, the workflow's, or the person's only
    one); a workflow named must be of that team.

    Not idempotent: each call makes a new subscription with a new secret.
    """
    name, url, events = _check(name=name, url=url, events=events)
    team_id = _team_for(user=user, team_id=team_id, workflow_id=workflow_id)
    _workflow_in_team(workflow_id, team_id)
    with transaction.atomic():
        subscription, secret = _with_new_secret(
            name=name,
            url=url,
            events=events,
            workflow_id=workflow_id,
            team_id=team_id,
            created_by=user,
        )
        audit_record(
            action="webhook.subscription_created",
            object_type="webhook_subscription",
            object_id=subscription.pk,
            team_id=subscription.team_id,
            actor=user,
            after=_facts(subscription),
        )
    return subscription, secret


def _workflow_in_team(workflow_id: int | None, team_id: int | None) -> None:
    if (
        workflow_id is not None
        and not Workflow.objects.filter(Q(team_id=team_id), pk=workflow_id).exists()
    ):
        raise WebhookError(
            "the workflow is another team's",
            {"workflow": ["Choose a workflow of the subscription's team."]},
        )


def _with_new_secret(**fields: Any) -> tuple[Subscription, str]:
    """A new subscription with a signing secret of its own, stored sealed."""
    secret = secret_generate()
    subscription = Subscription.objects.create(
        **fields, secret_sealed=vault().seal({"secret": secret})
    )
    return subscription, secret


# What a launch's callback hears of its run: how it ended, and that it waits for an approval.
CALLBACK_EVENTS = sorted(
    {
        Event.RUN_FINISHED,
        Event.RUN_FAILED,
        Event.RUN_NEEDS_RECONCILIATION,
        Event.APPROVAL_REQUESTED,
    }
)


def callback_url_problem(url: str) -> str:
    """Why ``url`` cannot be a callback address ('' when it can): the rule of subscriptions, and
    a host the administrators listed (PANDAWEB_CALLBACK_HOSTS). Anyone who may launch names a
    callback, where only administrators make subscriptions: without the list, a launch could
    send signed requests with the run's data anywhere the server reaches."""
    url = url.strip()
    if problem := _url_problem(url):
        return problem
    if not settings.CALLBACK_HOSTS:
        return (
            "Callbacks are off on this installation: an administrator lists the hosts they may "
            "go to in PANDAWEB_CALLBACK_HOSTS."
        )
    try:
        parts = urlsplit(url)
        patterns = [parse_host_pattern(h) for h in settings.CALLBACK_HOSTS]
        host, port = normalize_host(parts.hostname or ""), parts.port
    except (ValueError, HostPatternError):
        return "The address is not a valid URL."
    if not host_allowed(host, port, patterns):
        return (
            f"Callbacks may only go to {', '.join(settings.CALLBACK_HOSTS)} "
            "(PANDAWEB_CALLBACK_HOSTS), not to this address."
        )
    return ""


def callback_subscribe(*, run: Run, url: str, user: User) -> str:
    """Send the run's settling and approval events to ``url`` and return the signing secret.

    Precondition: inside the launch's transaction (so no event of the run can come before it)
    and ``callback_url_problem(url)`` is ''. Not idempotent: a run has one callback.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("callback_subscribe() must run inside the launch's transaction")
    subscription, secret = _with_new_secret(
        name=f"Callback of run {run.pk}",
        url=url.strip(),
        run=run,
        workflow_id=run.workflow_id,
        team_id=run.team_id,
        events=CALLBACK_EVENTS,
        created_by=user,
    )
    audit_record(
        action="webhook.callback_created",
        object_type="webhook_subscription",
        object_id=subscription.pk,
        team_id=run.team_id,
        actor=user,
        after={"run": run.pk, "url": subscription.url, "events": CALLBACK_EVENTS},
        run_id=run.pk,
    )
    return secret


class CallbackMismatch(Exception):
    """An Idempotency-Key replays a launch that named another callback address."""


def callback_for_launch(*, run: Run, created: bool, url: str, user: User) -> tuple[str, str] | None:
    """The launch's callback as (address, signing secret): made for a new run, or the one of
    the run an Idempotency-Key replays, which must have been launched with the same address (it
    is part of the request's body). None without a callback."""
    if created:
        return (url, callback_subscribe(run=run, url=url, user=user)) if url else None
    existing = Subscription.objects.filter(run_id=run.pk).first()
    if (existing.url if existing else "") != url:
        raise CallbackMismatch(
            f"the idempotency key was already used for a launch with another callback_url "
            f"(run {run.pk})"
        )
    return (url, subscription_secret(existing)) if existing else None


def _lock(subscription_id: int, user: User | None = None) -> Subscription:
    """The subscription, row-locked; one of a team ``user`` does not manage is as missing
    (``Subscription.DoesNotExist``), whoever called."""
    subscription = Subscription.objects.select_for_update().get(pk=subscription_id)
    if user is not None and not user_can(user, MANAGE, team_id=subscription.team_id):
        raise Subscription.DoesNotExist("no such subscription")
    return subscription


def subscription_update(
    *,
    subscription_id: int,
    user: User,
    name: str,
    url: str,
    events: list[str],
    workflow_id: int | None,
) -> Subscription:
    """Change where and what a subscription sends. Idempotent: the same values change nothing
    (and write no audit event)."""
    name, url, events = _check(name=name, url=url, events=events)
    with transaction.atomic():
        subscription = _lock(subscription_id, user)
        _workflow_in_team(workflow_id, subscription.team_id)
        before = _facts(subscription)
        subscription.name, subscription.url, subscription.events = name, url, events
        subscription.workflow_id = workflow_id
        subscription.save()
        after = _facts(subscription)
        if after != before:
            audit_record(
                action="webhook.subscription_updated",
                object_type="webhook_subscription",
                object_id=subscription.pk,
                team_id=subscription.team_id,
                actor=user,
                before=before,
                after=after,
            )
    return subscription


def subscription_set_active(
    *, subscription_id: int, user: User | None, active: bool, reason: str = ""
) -> Subscription:
    """Switch a subscription on or off (``user`` None: switched off by the deliverer after
    repeated failures). Idempotent. Switching on resets the failure count."""
    with transaction.atomic():
        subscription = _lock(subscription_id, user)
        if subscription.active == active:
            return subscription
        subscription.active = active
        subscription.disabled_reason = "" if active else (reason or "switched off by a person")
        if active:
            subscription.consecutive_failures = 0
        subscription.save()
        audit_record(
            action="webhook.subscription_enabled" if active else "webhook.subscription_disabled",
            object_type="webhook_subscription",
            object_id=subscription.pk,
            team_id=subscription.team_id,
            actor=user,
            before={"active": not active},
            after={
                "active": active,
                **({"reason": subscription.disabled_reason} if not active else {}),
            },
        )
    return subscription


def subscription_delete(*, subscription_id: int, user: User) -> None:
    """Delete a subscription with its delivery log; the audit event keeps what it was.

    Messages still pending are never sent. Not idempotent: a deleted subscription is gone
    (``Subscription.DoesNotExist``).
    """
    with transaction.atomic():
        subscription = _lock(subscription_id, user)
        facts = _facts(subscription)
        messages = subscription.messages.count()
        subscription.delete()
        audit_record(
            action="webhook.subscription_deleted",
            object_type="webhook_subscription",
            object_id=subscription_id,
            team_id=subscription.team_id,
            actor=user,
            before={**facts, "messages": messages},
        )


def subscription_rotate_secret(*, subscription_id: int, user: User) -> str:
    """Give a subscription a new secret and return it (shown once). The old one stops working
    at once: messages still pending are signed with the new one."""
    secret = secret_generate()
    with transaction.atomic():
        subscription = _lock(subscription_id, user)
        subscription.secret_sealed = vault().seal({"secret": secret})
        subscription.save(update_fields=["secret_sealed", "updated_at"])
        audit_record(
            action="webhook.secret_rotated",
            object_type="webhook_subscription",
            object_id=subscription.pk,
            team_id=subscription.team_id,
            actor=user,
        )
    return secret


# The outbox --------------------------------------------------------------------------------------


def outbox_record(
    *, event: str, run: Run | None = None, approval: ApprovalRequest | None = None
) -> list[Message]:
    """Write one message per active subscription that wants ``event`` for this workflow, of
    the run's team: a subscriber never hears of another team's runs.

    Precondition: inside the transaction of the change being announced (so the outbox row
    commits with it). Delivery is queued on commit. Not idempotent: each call is one event.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("outbox_record() must run inside the transaction of the change")
    subject_run = run if run is not None else approval.run if approval is not None else None
    if subject_run is None:
        raise ValueError("an event is about a run or an approval")
    subscriptions = [
        s
        for s in Subscription.objects.filter(Q(team_id=subject_run.team_id), active=True).filter(
            Q(run__isnull=True, workflow__isnull=True)
            | Q(run__isnull=True, workflow_id=subject_run.workflow_id)
            | Q(run_id=subject_run.pk)
        )
        if event in s.events
    ]
    if not subscriptions:
        return []
    now = timezone.now()
    data = (
        payloads.approval_data(approval, subject_run)
        if approval is not None
        else payloads.run_data(subject_run)
    )
    body = {"type": event, "timestamp": now.isoformat(), "data": data}
    messages = Message.objects.bulk_create(
        Message(
            subscription=s,
            msg_id=f"msg_{uuid.uuid4().hex}",
            event=event,
            payload=body,
            next_attempt_at=now,
        )
        for s in subscriptions
    )
    for message in Message.objects.filter(msg_id__in=[m.msg_id for m in messages]):
        dispatch(task_named("webhooks.deliver"), message_id=message.pk)
    return messages


def outbox_record_run(*, run: Run) -> None:
    """Announce a run's new status if it is one subscribers hear about (inside its transaction,
    after the transition). A run that starts waiting for approval announces its new request:
    the request is opened before the run moves, and its message must say the run waits."""
    if run.status == Run.Status.AWAITING_APPROVAL:
        approval = run.approvals.filter(status=ApprovalRequest.Status.PENDING).order_by("pk").last()
        if approval is not None:
            outbox_record_approval(approval=approval, run=run)
        return
    event = RUN_EVENTS.get(run.status)
    if event is not None:
        outbox_record(event=event, run=run)


def outbox_record_approval(*, approval: ApprovalRequest, run: Run | None = None) -> None:
    """Announce an approval that was just opened or closed (inside its transaction, after the
    run's transition if there is one). ``run`` is the locked run, so the message carries its
    status after the change rather than a copy read before it."""
    if approval.status == ApprovalRequest.Status.PENDING:
        outbox_record(event=Event.APPROVAL_REQUESTED, run=run, approval=approval)
    elif approval.status in APPROVAL_DECIDED_STATUSES:
        outbox_record(event=Event.APPROVAL_DECIDED, run=run, approval=approval)


# Delivery ----------------------------------------------------------------------------------------


def backoff(attempts: int) -> timedelta:
    """Wait after the ``attempts``-th failed attempt: 30 s, 2 min, 8 min, 32 min, … up to 6 h."""
    return timedelta(seconds=min(30 * 4 ** (attempts - 1), 6 * 3600))


@dataclass(frozen=True)
class Outcome:
    status_code: int | None
    error: str
    duration_ms: int

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def _post(url: str, body: str, headers: dict[str, str]) -> Outcome:
    started = time.monotonic()
    try:
        # No redirects: a message goes to the configured address and nowhere else.
        response = requests.post(
            url,
            data=body.encode(),
            headers=headers,
            timeout=settings.WEBHOOK_TIMEOUT_SECONDS,
            allow_redirects=False,
        )
        response.close()
        status_code: int | None = response.status_code
        error = (
            ""
            if 200 <= response.status_code < 300
            else f"the receiver answered {response.status_code}"
        )
    except requests.Timeout:
        status_code, error = None, f"no answer within {settings.WEBHOOK_TIMEOUT_SECONDS} s"
    except requests.ConnectionError:
        status_code, error = None, "could not connect to the receiver"
    except requests.RequestException as exc:
        status_code, error = None, f"the request failed: {type(exc).__name__}"
    return Outcome(status_code, error, int((time.monotonic() - started) * 1000))


def signed_headers(*, secret: str, msg_id: str, when: datetime, body: str) -> dict[str, str]:
    """The Standard Webhooks headers for ``body``."""
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(when.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id=msg_id, timestamp=when, data=body),
    }


def _claim(message_id: int, *, manual: bool) -> bool:
    now = timezone.now()
    lease = now + timedelta(seconds=settings.WEBHOOK_TIMEOUT_SECONDS + 60)
    claimable = Message.objects.filter(pk=message_id, status=Message.Status.PENDING).filter(
        Q(locked_until__isnull=True) | Q(locked_until__lt=now)
    )
    if not manual:
        claimable = claimable.filter(next_attempt_at__lte=now)
    # Exactly one worker's update touches the row; any other finds it locked and walks away.
    # Only the row's own columns in the condition: PostgreSQL re-checks those after waiting for
    # another worker's update, but not a join's subquery, which would let every waiter through.
    return claimable.update(locked_until=lease) == 1


def message_deliver(*, message_id: int, manual: bool = False) -> Attempt | None:
    """POST a due message once and record the attempt; None when another worker holds it, it is
    not due, or it is no longer pending. Safe to call from several workers at once."""
    if not _claim(message_id, manual=manual):
        return None
    message = Message.objects.select_related("subscription").get(pk=message_id)
    subscription = message.subscription
    if not (subscription.active or manual):
        Message.objects.filter(pk=message_id).update(locked_until=None)
        return None
    body = json.dumps(message.payload, separators=(",", ":"), ensure_ascii=False)
    started_at = timezone.now()
    headers = signed_headers(
        secret=subscription_secret(subscription), msg_id=message.msg_id, when=started_at, body=body
    )
    outcome = _post(subscription.url, body, headers)
    return _record(message_id, outcome, started_at=started_at, manual=manual)


def _record(message_id: int, outcome: Outcome, *, started_at: datetime, manual: bool) -> Attempt:
    disable_reason = ""
    with transaction.atomic():
        message = Message.objects.select_for_update().get(pk=message_id)
        subscription = _lock(message.subscription_id)
        attempt = Attempt.objects.create(
            message=message,
            started_at=started_at,
            duration_ms=outcome.duration_ms,
            status_code=outcome.status_code,
            error=outcome.error[:500],
            ok=outcome.ok,
            manual=manual,
        )
        message.attempts += 1
        message.locked_until = None
        message.last_status_code = outcome.status_code
        message.last_error = outcome.error[:500]
        if outcome.ok:
            message.status = Message.Status.DELIVERED
            message.delivered_at = timezone.now()
            subscription.consecutive_failures = 0
        else:
            subscription.consecutive_failures += 1
            if message.attempts >= settings.WEBHOOK_MAX_ATTEMPTS:
                message.status = Message.Status.FAILED
            else:
                message.next_attempt_at = timezone.now() + backoff(message.attempts)
            if (
                subscription.active
                and subscription.consecutive_failures >= settings.WEBHOOK_DISABLE_AFTER
            ):
                disable_reason = (
                    f"{subscription.consecutive_failures} failed attempts in a row; "
                    f"the last: {outcome.error}"
                )
        message.save()
        subscription.save(update_fields=["consecutive_failures"])
    if disable_reason:
        subscription_set_active(
            subscription_id=subscription.pk, user=None, active=False, reason=disable_reason
        )
    return attempt


def message_redeliver(*, message_id: int, user: User) -> Message:
    """Send a message again now, whatever became of it (same ``webhook-id``, so a receiver that
    already handled it can tell). The POST is queued; its attempt is marked as manual."""
    with transaction.atomic():
        message = Message.objects.select_for_update().get(pk=message_id)
        try:
            _lock(message.subscription_id, user)
        except Subscription.DoesNotExist:
            raise Message.DoesNotExist("no such message") from None
        message.status = Message.Status.PENDING
        message.next_attempt_at = timezone.now()
        message.save(update_fields=["status", "next_attempt_at"])
        audit_record(
            action="webhook.redelivered",
            object_type="webhook_message",
            object_id=message.pk,
            team_id=message.subscription.team_id,
            actor=user,
            after={
                "msg_id": message.msg_id,
                "event": message.event,
                "url": message.subscription.url,
            },
        )
        dispatch(task_named("webhooks.deliver"), message_id=message.pk, manual=True)
    return message


def messages_drain(*, limit: int = 100) -> int:
    """Deliver every due message (up to ``limit``); returns how many were attempted here."""
    now = timezone.now()
    due = (
        Message.objects.filter(
            status=Message.Status.PENDING, next_attempt_at__lte=now, subscription__active=True
        )
        .filter(Q(locked_until__isnull=True) | Q(locked_until__lt=now))
        .order_by("next_attempt_at", "pk")
        .values_list("pk", flat=True)[:limit]
    )
    attempted = 0
    for message_id in list(due):
        if message_deliver(message_id=message_id) is not None:
            attempted += 1
    return attempted
