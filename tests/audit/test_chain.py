from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pandaweb.audit.chain import (
    GENESIS,
    HASHED_FIELDS,
    canonical,
    event_hash,
    format_datetime,
    verify,
)

T0 = datetime(2025, 3, 1, 9, 30, tzinfo=UTC)


def make_event(sequence: int, prev_hash: str, **overrides: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "sequence": sequence,
        "occurred_at": T0 + timedelta(seconds=sequence),
        "actor_kind": "user",
        "actor_id": 7,
        "actor_label": "olivia.operator",
        "action": "workflow.published",
        "object_type": "workflow",
        "object_id": str(sequence),
        "before": {"version": sequence - 1},
        "after": {"version": sequence, "title": "Pay the électricité bill"},
        "request_id": f"req-{sequence}",
        "client_ip": "192.0.2.10",
        "run_id": None,
        "step_id": None,
        "approval_id": None,
        "extra": {},
        "prev_hash": prev_hash,
    }
    event.update(overrides)
    event["hash"] = event_hash(event, prev_hash)
    return event


def make_chain(length: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    prev_hash = GENESIS
    for sequence in range(1, length + 1):
        event = make_event(sequence, prev_hash)
        events.append(event)
        prev_hash = event["hash"]
    return events


def test_canonical_form_is_sorted_compact_utf8_with_utc_microseconds() -> None:
    event = make_event(
        1, GENESIS, occurred_at=datetime(2025, 3, 1, 10, 0, tzinfo=timezone(timedelta(hours=1)))
    )

    text = canonical(event).decode("utf-8")

    assert text.startswith('{"action":"workflow.published","actor_id":7,')
    assert '"occurred_at":"2025-03-01T09:00:00.000000Z"' in text
    assert "électricité" in text
    assert " " not in text.replace("Pay the électricité bill", "")
    assert '"hash"' not in text
    assert list(json.loads(text)) == sorted(HASHED_FIELDS)


def test_it_refuses_naive_datetimes() -> None:
    with pytest.raises(ValueError, match="naive"):
        format_datetime(datetime(2025, 3, 1, 9, 30))


def test_integral_floats_hash_like_the_integers_a_json_store_returns() -> None:
    as_float = make_event(1, GENESIS, after={"amount": 1e16, "rate": 2.0, "share": 0.25})
    as_read_back = make_event(1, GENESIS, after={"amount": 10**16, "rate": 2, "share": 0.25})

    assert as_float["hash"] == as_read_back["hash"]


@pytest.mark.parametrize("field", HASHED_FIELDS)
def test_the_hash_changes_with_every_field(field: str) -> None:
    event = make_event(3, "a" * 64)
    changed = dict(event)
    changed[field] = {"sequence": 4, "occurred_at": T0}.get(field, "something else")

    assert event_hash(changed, "a" * 64) != event["hash"]


def test_the_hash_depends_on_the_previous_hash() -> None:
    event = make_event(1, GENESIS)

    assert event_hash(event, "f" * 64) != event["hash"]


def test_it_verifies_an_intact_chain() -> None:
    events = make_chain(10)

    result = verify(iter(events))

    assert result.ok
    assert result.count == 10
    assert result.last_sequence == 10
    assert result.last_hash == events[-1]["hash"]
    assert result.first_bad_sequence is None


def test_an_empty_chain_is_intact_and_ends_at_genesis() -> None:
    result = verify([])

    assert result.ok
    assert result.count == 0
    assert result.last_hash == GENESIS


def test_it_detects_a_first_event_not_linked_to_genesis() -> None:
    events = make_chain(3)
    events[0] = make_event(1, "b" * 64)

    result = verify(events)

    assert not result.ok
    assert result.first_bad_sequence == 1
    assert "prev_hash" in result.reason


def test_it_verifies_a_slice_anchored_on_its_first_prev_hash() -> None:
    events = make_chain(10)

    result = verify(events[4:])

    assert result.ok
    assert result.count == 6
    assert result.last_hash == events[-1]["hash"]


def test_it_detects_a_missing_beginning_when_told_where_the_chain_starts() -> None:
    events = make_chain(10)

    result = verify(events[2:], start_sequence=1)

    assert not result.ok
    assert result.first_bad_sequence == 1


def test_it_detects_a_missing_field() -> None:
    events = make_chain(5)
    del events[2]["extra"]

    result = verify(events)

    assert not result.ok
    assert result.first_bad_sequence == 3
    assert "extra" in result.reason


def test_it_reports_a_truncated_tail_only_against_an_expected_end() -> None:
    events = make_chain(10)

    assert verify(events[:7]).ok
    by_count = verify(events[:7], expected_last_sequence=10)
    by_head = verify(events[:7], expected_head=events[-1]["hash"])

    assert not by_count.ok
    assert by_count.first_bad_sequence == 8
    assert "truncated" in by_count.reason
    assert not by_head.ok
    assert by_head.first_bad_sequence == 7
    assert verify(events, expected_last_sequence=10, expected_head=events[-1]["hash"]).ok


def test_it_detects_events_past_the_expected_end() -> None:
    result = verify(make_chain(10), expected_last_sequence=8)

    assert not result.ok
    assert result.first_bad_sequence == 9


def test_it_streams_without_holding_the_chain() -> None:
    def generate() -> Any:
        prev_hash = GENESIS
        for sequence in range(1, 2001):
            event = make_event(sequence, prev_hash)
            prev_hash = event["hash"]
            yield event

    result = verify(generate())

    assert result.ok
    assert result.count == 2000


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=4,
)
replacement_values = json_values | st.datetimes(timezones=st.just(UTC))


def canonical_text(value: Any) -> str:
    return canonical(dict.fromkeys(HASHED_FIELDS, value)).decode("utf-8")


@st.composite
def chains(draw: st.DrawFn) -> list[dict[str, Any]]:
    length = draw(st.integers(min_value=1, max_value=8))
    events: list[dict[str, Any]] = []
    prev_hash = GENESIS
    for sequence in range(1, length + 1):
        event = make_event(
            sequence,
            prev_hash,
            actor_kind=draw(st.sampled_from(["user", "runner", "system"])),
            actor_id=draw(st.none() | st.integers(min_value=1)),
            action=draw(st.text(min_size=1, max_size=12)),
            before=draw(json_values),
            after=draw(json_values),
            run_id=draw(st.none() | st.integers(min_value=1)),
            extra=draw(st.dictionaries(st.text(max_size=5), json_values, max_size=3)),
        )
        events.append(event)
        prev_hash = event["hash"]
    return events


# Generating whole chains is slower than hypothesis expects of a strategy; that is the point.
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=chains(), data=st.data())
def test_any_single_field_mutation_is_detected_at_that_event(
    events: list[dict[str, Any]], data: st.DataObject
) -> None:
    index = data.draw(st.integers(min_value=0, max_value=len(events) - 1), label="index")
    field = data.draw(st.sampled_from([*HASHED_FIELDS, "hash"]), label="field")
    old = events[index][field]
    new = data.draw(
        replacement_values.filter(lambda value: canonical_text(value) != canonical_text(old)),
        label="new value",
    )
    tampered = copy.deepcopy(events)
    tampered[index][field] = new

    result = verify(tampered, start_sequence=1)

    assert not result.ok
    assert result.first_bad_sequence == index + 1
    assert result.count == index
