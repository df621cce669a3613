"""Writing to the audit trail, and checking it.

Concurrency: every event links to the one before it, so two writers must never read the same head.
``audit_record`` serializes writers on the chain head for the rest of the caller's transaction:

- PostgreSQL: ``pg_advisory_xact_lock(AUDIT_CHAIN_LOCK)``, released at commit or rollback. The head
  is read *after* the lock is granted; under READ COMMITTED that read sees the previous writer's
  committed event. (A caller in REPEATABLE READ / SERIALIZABLE whose snapshot predates the lock
  would read a stale head; the unique ``sequence`` then refuses the insert instead of forking.)
- SQLite: the project opens transactions with ``transaction_mode=IMMEDIATE`` (settings), so BEGIN
  already holds the database's single write lock, and nobody else can append until commit.

Either way the unique constraint on ``sequence`` is the last line: a fork cannot be stored. The lock
is held until the caller's transaction ends, so record the event late in short transactions. The
same lock guards every team's chain head (``team_prev_hash`` / ``team_hash``, see ``chain.py``):
one lock, one order, and an event joins both chains at once.

Values in ``before`` / ``after`` / ``extra``: secrets are redacted (``redaction.redact``), then the
result is made plain JSON *before* hashing, so what is hashed is what is stored and read back:

- ``Decimal`` -> ``str(value)`` (``Decimal("12.50")`` -> ``"12.50"``: the scale survives);
- ``datetime`` -> ISO 8601 UTC with microseconds and ``Z`` (``chain.format_datetime``);
  ``date`` / ``time`` -> ``isoformat()``; ``UUID`` -> ``str``; ``timedelta`` -> total seconds;
- enum members -> their value; tuples -> lists; integer keys -> strings;
- anything else (bytes, sets, model instances, non-finite floats) is refused with TypeError:
  pass an id or a string instead of guessing a representation.
"""

from __future__ import annotations

import enum
import ipaddress
import math
import uuid
from collections.abc import Iterable, Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import connection, transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.ipv6 import clean_ipv6_address

from pandaweb.audit import chain
from pandaweb.audit.context import current_request
from pandaweb.audit.models import AuditEvent
from pandaweb.audit.redaction import redact
from sessions.models import Run

# The key of the PostgreSQL advisory lock that guards the chain head (ASCII "pandaaud"). Any
# constant works as long as nothing else in the database uses it.
AUDIT_CHAIN_LOCK = 0x70616E6461617564

_MAX_CHARS = 100  # object_type, object_id, action, request_id columns


def audit_record(
    *,
    action: str,
    object_type: str,
    object_id: str | int,
    actor: AbstractBaseUser | None = None,
    actor_kind: AuditEvent.ActorKind | None = None,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
    request: HttpRequest | None = None,
    run_id: int | None = None,
    step_id: int | None = None,
    approval_id: int | None = None,
    team_id: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> AuditEvent:
    """Append one event to the chain and return it.

    Precondition: called inside the caller's ``transaction.atomic()`` (RuntimeError otherwise), so
    the event commits or rolls back with the change it records, and a rollback leaves no gap.
    ``actor_kind`` defaults to USER when ``actor`` is given, SYSTEM otherwise.
    ``team_id``: the team whose workflow, run, credential or subscription the event is about (the
    event then joins that team's chain too); none for the installation's own matters (people,
    tokens, the system). Callers pass it from the object in hand; a run's event that does not is
    given its run's team (one query), because an event of a run missing from its team's trail would
    be missing from that team's export, which no test of the caller would notice.
    Not idempotent: each call appends a new event.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError(
            "audit_record() must run inside the transaction of the change it records "
            "(wrap the service in transaction.atomic())"
        )
    if actor_kind is None:
        actor_kind = AuditEvent.ActorKind.USER if actor is not None else AuditEvent.ActorKind.SYSTEM
    if actor_kind == AuditEvent.ActorKind.USER and actor is None:
        raise ValueError("a user event needs the user (actor)")
    if team_id is None and run_id is not None:
        team_id = _run_team_id(run_id)
    object_id = str(object_id)
    for name, text in (("action", action), ("object_type", object_type), ("object_id", object_id)):
        if not text or len(text) > _MAX_CHARS:
            raise ValueError(f"{name} must be 1 to {_MAX_CHARS} characters, got {text!r}")

    credential = "credential" in object_type.lower()
    fields: dict[str, Any] = {
        "actor_kind": str(actor_kind),
        "actor_id": actor.pk if actor is not None else None,
        "actor_label": actor.get_username() if actor is not None else str(actor_kind),
        "action": action,
        "object_type": object_type,
        "object_id": object_id,
        "before": _plain(redact(before, credential=credential)),
        "after": _plain(redact(after, credential=credential)),
        "request_id": _request_id(request or current_request.get()),
        "client_ip": _client_ip(request or current_request.get()),
        "run_id": run_id,
        "step_id": step_id,
        "approval_id": approval_id,
        "team_id": team_id,
        "extra": _plain(redact(_with_token(extra, request or current_request.get()))),
    }

    _lock_chain_head()
    head = AuditEvent.objects.order_by("-sequence").values_list("sequence", "hash").first()
    sequence, prev_hash = (head[0] + 1, head[1]) if head else (1, chain.GENESIS)
    # Taken under the lock, so time never runs backwards along the chain (barring clock steps).
    fields["occurred_at"] = timezone.now()
    fields["sequence"] = sequence
    fields["prev_hash"] = prev_hash
    if team_id is not None:
        # Under the same lock: no other writer can append to this team's chain meanwhile. The
        # team link is set before the global hash, which covers it (chain.canonical).
        fields["team_prev_hash"] = (
            AuditEvent.objects.filter(team_id=team_id, team_hash__isnull=False)
            .order_by("-sequence")
            .values_list("team_hash", flat=True)
            .first()
        ) or chain.GENESIS
        fields["team_hash"] = chain.team_event_hash(fields, fields["team_prev_hash"])
    fields["hash"] = chain.event_hash(fields, prev_hash)
    return AuditEvent.objects.create(**fields)


def audit_verify_database(*, batch_size: int = 5000) -> chain.VerifyResult:
    """Verify the whole chain in the database, streaming it in sequence order.

    Memory stays bounded by ``batch_size`` rows. The chain must start at sequence 1. A tail cut off
    the end is not detectable from the table alone; compare ``last_hash`` with a head kept
    elsewhere. Read-only and idempotent.
    """
    rows = (
        AuditEvent.objects.order_by("sequence")
        .values(*chain.STORED_FIELDS)
        .iterator(chunk_size=batch_size)
    )
    return chain.verify(rows, start_sequence=1)


def audit_verify_team(*, team_id: int, batch_size: int = 5000) -> chain.VerifyResult:
    """Verify one team's chain in the database on its own (``chain.verify_team``), from its
    genesis: an edited, removed or reordered event of the team shows without reading any other
    team's events. Events of the team written before team chains existed are on no team chain and
    are checked by ``audit_verify_database`` only. Read-only and idempotent."""
    rows = team_trail(team_id).values(*chain.STORED_FIELDS).iterator(chunk_size=batch_size)
    return chain.verify_team(rows, team_id=team_id)


def audit_verify_teams(team_ids: Iterable[int]) -> chain.VerifyResult:
    """Each team's chain on its own (``audit_verify_team``): the first that breaks, else all of
    them in one result (the head is a team's head only when there is one team): what a person
    who may verify some teams only is told. Read-only and idempotent."""
    results = [audit_verify_team(team_id=team_id) for team_id in sorted(team_ids)]
    for result in results:
        if not result.ok:
            return result
    return chain.VerifyResult(
        ok=True,
        count=sum(result.count for result in results),
        last_hash=results[0].last_hash if len(results) == 1 else "",
        last_sequence=max((r.last_sequence or 0 for r in results), default=0) or None,
    )


def team_trail(team_id: int) -> QuerySet[AuditEvent]:
    """The events on team ``team_id``'s chain, in sequence order (index ``audit_team_trail``)."""
    return AuditEvent.objects.filter(team_id=team_id, team_prev_hash__isnull=False).order_by(
        "sequence"
    )


def _run_team_id(run_id: int) -> int | None:
    return Run.objects.filter(pk=run_id).values_list("team_id", flat=True).first()


def _with_token(extra: Mapping[str, Any] | None, request: HttpRequest | None) -> dict[str, Any]:
    """``extra``, plus the API token the request was made with (``request.api_token``, set by the
    API's authentication), so every change made through a token names it."""
    token = getattr(request, "api_token", None) if request is not None else None
    if token is None:
        return dict(extra or {})
    return {**(extra or {}), "via": dict(token.audit_label)}


def audit_chain_lock() -> None:
    """Take the chain's lock now rather than at the next ``audit_record`` (held to the end of
    the caller's transaction). For a service with a lock of its own that it takes after
    writing audit rows in some transactions: taking the chain first everywhere keeps one order."""
    _lock_chain_head()


def _lock_chain_head() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [AUDIT_CHAIN_LOCK])
    # SQLite: BEGIN IMMEDIATE (settings.DATABASES OPTIONS transaction_mode) already holds the
    # write lock. Should it be missing, the second of two writers fails to upgrade its lock or hits
    # the unique sequence: an error, never a fork.


def _request_id(request: HttpRequest | None) -> str:
    if request is None:
        return ""
    value = getattr(request, "request_id", None) or request.META.get("HTTP_X_REQUEST_ID") or ""
    # A header the client controls: bounded, so it cannot bloat or break the insert.
    return str(value)[:_MAX_CHARS]


def _client_ip(request: HttpRequest | None) -> str | None:
    if request is None:
        return None
    raw = request.META.get("REMOTE_ADDR") or ""
    try:
        address = ipaddress.ip_address(raw)
    except ValueError:
        return None
    if address.version == 6:
        # Django's own spelling (and PostgreSQL's inet output), so the stored text reads back
        # exactly as it was hashed: "::ffff:1.2.3.4", lower case, compressed.
        return clean_ipv6_address(raw)
    return str(address)


def _plain(value: Any, path: str = "") -> Any:
    """Turn ``value`` into plain JSON data (see the module docstring for the rules)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, enum.Enum):
        return _plain(value.value, path)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"{path or 'value'}: {value!r} cannot be stored as JSON")
        return value
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise TypeError(f"{path or 'value'}: {value!r} cannot be stored as JSON")
        return str(value)
    if isinstance(value, datetime):
        if timezone.is_naive(value):
            raise TypeError(f"{path or 'value'}: naive datetime {value!r} names no instant")
        return chain.format_datetime(value)
    if isinstance(value, date | time):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Mapping):
        result: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(key, bool) or not isinstance(key, str | int):
                raise TypeError(f"{path or 'value'}: key {key!r} must be a string")
            result[str(key)] = _plain(item, f"{path}.{key}" if path else str(key))
        return result
    if isinstance(value, list | tuple):
        return [_plain(item, f"{path}[{index}]") for index, item in enumerate(value)]
    raise TypeError(
        f"{path or 'value'}: {type(value).__name__} is not stored in the audit trail; "
        "pass an id or a string"
    )
