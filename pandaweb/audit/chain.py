"""The hash chain of the audit trail: canonical form, hashing and verification (no Django imports).

Every event carries ``prev_hash`` (the hash of the event before it, ``GENESIS`` for the first) and
``hash`` = sha256(canonical(event fields) + prev_hash). Editing, inserting, deleting or reordering
any event therefore changes a hash that every later event depends on. The chain alone cannot tell
that events were cut off the *end*: compare the head with one kept elsewhere (``expected_head``,
``expected_last_sequence``) for that.

A team's events form a second chain of their own beside the global one, so that one team's trail
verifies without any other team's events: ``team_prev_hash`` (the ``team_hash`` of the previous
event *of the same team*, ``GENESIS`` for its first) and ``team_hash`` = sha256(canonical(event
fields) + team_prev_hash). The global chain is unchanged; events about the installation (people,
tokens, the system) have no team and are on the global chain only.

This module is deliberately free of Django so that an exported copy of the trail can be verified by
a small script on a machine that has never seen the application.

Canonical form (what is hashed):

- exactly the fields in ``HASHED_FIELDS``, and ``TEAM_FIELDS`` (``team_id``, ``team_prev_hash``)
  when the event is on a team chain (``team_prev_hash`` not null), as one JSON object with sorted
  keys, no whitespace, UTF-8 (not ASCII-escaped), NaN and infinities refused. An event without a
  team, and every event written before team chains existed, therefore hashes exactly as it always
  did; a team's event has its team and its team link under the global hash too (so the global
  chain and its checkpoints pin every team chain). ``hash`` and ``team_hash`` are never hashed;
- datetimes as ISO 8601 in UTC with microseconds and a ``Z`` (``2025-01-31T09:05:00.000000Z``);
  naive datetimes are refused because they name no instant;
- floats with an integral value as integers (``1.0`` -> ``1``), because a JSON store may give them
  back either way (PostgreSQL's jsonb returns ``1e16`` as ``10000000000000000``);
- mapping keys must be strings, lists and tuples are lists; any other type is refused rather than
  guessed at, so that what is hashed is exactly what a JSON column stores and gives back.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

GENESIS = "0" * 64

HASHED_FIELDS: tuple[str, ...] = (
    "sequence",
    "occurred_at",
    "actor_kind",
    "actor_id",
    "actor_label",
    "action",
    "object_type",
    "object_id",
    "before",
    "after",
    "request_id",
    "client_ip",
    "run_id",
    "step_id",
    "approval_id",
    "extra",
    "prev_hash",
)
# Hashed when the event is on a team chain (see the canonical form above).
TEAM_FIELDS: tuple[str, ...] = ("team_id", "team_prev_hash")
# What verifying reads of each stored event: everything hashed, and both hashes.
STORED_FIELDS: tuple[str, ...] = (*HASHED_FIELDS, *TEAM_FIELDS, "hash", "team_hash")


def on_team_chain(fields: Mapping[str, Any]) -> bool:
    """Whether the event carries a team link (and so hashes ``TEAM_FIELDS``)."""
    return fields.get("team_prev_hash") is not None


def format_datetime(value: datetime) -> str:
    """The one text form of an instant in the trail: UTC, microseconds, ``Z``."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"naive datetime {value!r} in an audit event: it names no instant")
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _canonical_value(value: Any, path: str) -> Any:
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        # int() strips subclasses (IntEnum) whose repr json might not print as a bare number.
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{path}: {value!r} is not representable in JSON")
        return int(value) if value.is_integer() else value
    if isinstance(value, datetime):
        return format_datetime(value)
    if isinstance(value, Mapping):
        result: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{path}: key {key!r} is not a string")
            result[key] = _canonical_value(item, f"{path}.{key}")
        return result
    if isinstance(value, list | tuple):
        return [_canonical_value(item, f"{path}[{index}]") for index, item in enumerate(value)]
    raise TypeError(f"{path}: {type(value).__name__} is not a JSON value of the audit trail")


def canonical(fields: Mapping[str, Any]) -> bytes:
    """The bytes that are hashed for one event; raises KeyError when a hashed field is missing."""
    names = (*HASHED_FIELDS, *TEAM_FIELDS) if on_team_chain(fields) else HASHED_FIELDS
    chosen = {name: _canonical_value(fields[name], name) for name in names}
    return json.dumps(
        chosen, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def event_hash(fields: Mapping[str, Any], prev_hash: str) -> str:
    """sha256 hex of the canonical fields followed by the previous event's hash."""
    digest = hashlib.sha256(canonical(fields))
    digest.update(prev_hash.encode("ascii"))
    return digest.hexdigest()


def team_event_hash(fields: Mapping[str, Any], team_prev_hash: str) -> str:
    """sha256 hex of the canonical fields followed by the previous event of the team's
    ``team_hash``: the link of the team's own chain."""
    return event_hash(fields, team_prev_hash)


@dataclass(frozen=True, slots=True)
class VerifyResult:
    ok: bool
    # Events that passed every check (all of them when ok).
    count: int
    # Hash and sequence of the last event that passed; GENESIS / None for an empty chain.
    last_hash: str
    last_sequence: int | None
    first_bad_sequence: int | None = None
    reason: str = ""


def verify(
    events: Iterable[Mapping[str, Any]],
    *,
    start_sequence: int | None = None,
    expected_last_sequence: int | None = None,
    expected_head: str | None = None,
) -> VerifyResult:
    """Check a chain event by event, holding only the previous event in memory.

    ``start_sequence``: the sequence the chain must begin with (None: whatever the first event
    says, so that a slice of a longer chain can be checked). A chain that begins at 1 must link to
    ``GENESIS``; a slice that begins later is anchored on its first event's ``prev_hash``.
    ``expected_last_sequence`` / ``expected_head``: where the chain must end, from a copy kept
    elsewhere; without them a truncated tail looks like a shorter, valid chain.

    Stops at the first problem: ``first_bad_sequence`` is the sequence that should have been there.
    """
    count = 0
    prev_hash = GENESIS
    expected: int | None = start_sequence
    last_sequence: int | None = None

    def broken(sequence: int | None, reason: str) -> VerifyResult:
        return VerifyResult(
            ok=False,
            count=count,
            last_hash=prev_hash,
            last_sequence=last_sequence,
            first_bad_sequence=sequence,
            reason=reason,
        )

    for event in events:
        sequence = event.get("sequence")
        if expected is None:
            if not isinstance(sequence, int) or isinstance(sequence, bool) or sequence < 1:
                return broken(None, f"first event has no valid sequence ({sequence!r})")
            expected = sequence
        if sequence != expected:
            if isinstance(sequence, int) and sequence > expected:
                return broken(
                    expected, f"sequence {expected} is missing (next event is {sequence})"
                )
            return broken(expected, f"expected sequence {expected}, found {sequence!r}")

        stored_prev = event.get("prev_hash")
        if count == 0 and expected != 1:
            # A slice of a longer chain: its first link can only be checked against the event
            # before it, which we were not given.
            if not isinstance(stored_prev, str):
                return broken(expected, "prev_hash is missing")
            prev_hash = stored_prev
        if stored_prev != prev_hash:
            return broken(expected, "prev_hash does not match the previous event's hash")

        try:
            recomputed = event_hash(event, prev_hash)
        except KeyError as exc:
            return broken(expected, f"field {exc.args[0]!r} is missing")
        except (TypeError, ValueError) as exc:
            return broken(expected, f"unhashable content: {exc}")
        if event.get("hash") != recomputed:
            return broken(expected, "hash does not match the event's content")

        count += 1
        prev_hash = recomputed
        last_sequence = expected
        expected += 1

    if expected_last_sequence is not None and last_sequence != expected_last_sequence:
        seen = last_sequence or 0
        if seen < expected_last_sequence:
            return broken(
                seen + 1,
                f"chain ends at sequence {seen}, expected {expected_last_sequence} (truncated)",
            )
        return broken(
            expected_last_sequence + 1,
            f"chain continues past the expected last sequence {expected_last_sequence}",
        )
    if expected_head is not None and prev_hash != expected_head:
        return broken(last_sequence, "head hash differs from the expected head")
    return VerifyResult(ok=True, count=count, last_hash=prev_hash, last_sequence=last_sequence)


def verify_team(
    events: Iterable[Mapping[str, Any]],
    *,
    team_id: int,
    first_team_prev_hash: str | None = GENESIS,
    expected_head: str | None = None,
) -> VerifyResult:
    """Check one team's chain: ``events`` are that team's chained events in sequence order (other
    teams' events are not needed, and not allowed: each must name ``team_id``).

    Each event's ``hash`` must be the hash of its content and its own ``prev_hash`` (the global
    links run through other teams' events, which are not here), its ``team_prev_hash`` the
    previous event's ``team_hash`` (the first: ``first_team_prev_hash``, ``GENESIS`` for a whole
    team chain; None anchors on whatever the first event says, for a slice), and its
    ``team_hash`` the hash of its content and ``team_prev_hash``. So an edited, removed, inserted
    or reordered event of the team shows. ``expected_head``: the ``team_hash`` the chain must end
    with (a tail cut off otherwise looks like a shorter chain). ``last_hash`` is the team's head.
    Stops at the first problem, naming its sequence.
    """
    count = 0
    team_prev = first_team_prev_hash
    last_sequence: int | None = None

    def broken(sequence: int | None, reason: str) -> VerifyResult:
        return VerifyResult(
            ok=False,
            count=count,
            last_hash=team_prev or GENESIS,
            last_sequence=last_sequence,
            first_bad_sequence=sequence,
            reason=reason,
        )

    for event in events:
        sequence = event.get("sequence")
        if not isinstance(sequence, int) or isinstance(sequence, bool) or sequence < 1:
            return broken(None, f"{sequence!r} is not a sequence number")
        if last_sequence is not None and sequence <= last_sequence:
            return broken(sequence, f"sequence {sequence} is out of order (after {last_sequence})")
        if event.get("team_id") != team_id or not on_team_chain(event):
            return broken(sequence, f"the event is not on the chain of team {team_id}")
        stored_team_prev = event.get("team_prev_hash")
        if team_prev is None:
            team_prev = stored_team_prev
        if stored_team_prev != team_prev:
            return broken(sequence, "team_prev_hash does not match the team's previous event")
        try:
            own = event_hash(event, str(event.get("prev_hash")))
            recomputed = team_event_hash(event, str(team_prev))
        except KeyError as exc:
            return broken(sequence, f"field {exc.args[0]!r} is missing")
        except (TypeError, ValueError) as exc:
            return broken(sequence, f"unhashable content: {exc}")
        if event.get("hash") != own:
            return broken(sequence, "hash does not match the event's content")
        if event.get("team_hash") != recomputed:
            return broken(sequence, "team_hash does not match the event's content")
        count += 1
        team_prev = recomputed
        last_sequence = sequence

    if expected_head is not None and (team_prev or GENESIS) != expected_head:
        return broken(last_sequence, "the team's head hash differs from the expected head")
    return VerifyResult(
        ok=True, count=count, last_hash=team_prev or GENESIS, last_sequence=last_sequence
    )
