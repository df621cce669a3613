from __future__ import annotations

import copy
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import ProtectedError
from django.test import RequestFactory

from pandaweb.audit.chain import GENESIS, event_hash, verify
from pandaweb.audit.models import AuditEvent
from pandaweb.audit.redaction import REDACTED
from pandaweb.audit.services import audit_record, audit_verify_database
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def record_events(count: int, actor: User) -> None:
    for number in range(count):
        with transaction.atomic():
            audit_record(
                action="workflow.published",
                object_type="workflow",
                object_id=number,
                actor=actor if number % 3 else None,
                before={"version": number},
                after={"version": number + 1, "amount": Decimal("10.50")},
                run_id=100 + number % 4,
            )


def exported_copy() -> list[dict[str, Any]]:
    """What an export would hold: every event as a plain dict, in sequence order."""
    return [
        copy.deepcopy(event.chain_fields()) for event in AuditEvent.objects.order_by("sequence")
    ]


def test_it_links_events_into_a_chain_from_genesis() -> None:
    olivia = UserFactory.create(username="olivia.operator")

    record_events(3, olivia)

    events = list(AuditEvent.objects.order_by("sequence"))
    assert [event.sequence for event in events] == [1, 2, 3]
    assert events[0].prev_hash == GENESIS
    assert events[1].prev_hash == events[0].hash
    assert events[2].prev_hash == events[1].hash
    assert events[1].hash == event_hash(events[1].chain_fields(), events[0].hash)
    assert audit_verify_database().ok


def test_it_records_who_did_it_and_keeps_their_name_after_a_rename() -> None:
    olivia = UserFactory.create(username="olivia.operator")
    with transaction.atomic():
        audit_record(action="run.launched", object_type="run", object_id=5, actor=olivia, run_id=5)
    olivia.username = "olivia.retired"
    olivia.save()

    event = AuditEvent.objects.get()
    assert event.actor_kind == AuditEvent.ActorKind.USER
    assert event.actor == olivia
    assert event.actor_label == "olivia.operator"
    assert event.run_id == 5
    assert audit_verify_database().ok


def test_it_defaults_to_a_system_event_without_an_actor() -> None:
    with transaction.atomic():
        audit_record(action="approval.expired", object_type="approval", object_id=9, approval_id=9)

    event = AuditEvent.objects.get()
    assert event.actor_kind == AuditEvent.ActorKind.SYSTEM
    assert event.actor is None
    assert event.actor_label == "system"
    assert event.approval_id == 9


def test_it_refuses_a_user_event_without_a_user() -> None:
    with pytest.raises(ValueError, match="user"), transaction.atomic():
        audit_record(
            action="x.y", object_type="x", object_id=1, actor_kind=AuditEvent.ActorKind.USER
        )

    assert not AuditEvent.objects.exists()


def test_it_takes_the_request_id_and_client_ip_from_the_request() -> None:
    request = RequestFactory().post(
        "/workflows/1/publish", HTTP_X_REQUEST_ID="req-42", REMOTE_ADDR="2001:DB8:0:0::1"
    )
    tagged = RequestFactory().post("/", REMOTE_ADDR="203.0.113.9")
    tagged.request_id = "from-middleware"  # type: ignore[attr-defined]

    with transaction.atomic():
        audit_record(action="a.b", object_type="workflow", object_id=1, request=request)
        audit_record(action="a.b", object_type="workflow", object_id=2, request=tagged)

    first, second = AuditEvent.objects.order_by("sequence")
    assert (first.request_id, first.client_ip) == ("req-42", "2001:db8::1")
    assert (second.request_id, second.client_ip) == ("from-middleware", "203.0.113.9")
    assert audit_verify_database().ok


def test_it_stores_secrets_redacted() -> None:
    with transaction.atomic():
        audit_record(
            action="credential.rotated",
            object_type="credential",
            object_id=3,
            before={"name": "bank login", "value": "old-secret", "password": "hunter2"},
            after={"name": "bank login", "value": "new-secret", "portal": {"api_key": "k-1"}},
            extra={"session_token": "abc", "reason": "quarterly rotation"},
        )

    event = AuditEvent.objects.get()
    assert event.before == {"name": "bank login", "value": REDACTED, "password": REDACTED}
    assert event.after == {"name": "bank login", "value": REDACTED, "portal": {"api_key": REDACTED}}
    assert event.extra == {"session_token": REDACTED, "reason": "quarterly rotation"}
    assert audit_verify_database().ok


def test_what_is_hashed_is_what_is_stored_and_read_back() -> None:
    awkward: dict[Any, Any] = {
        "amount": Decimal("1234.50"),
        "when": datetime(2025, 3, 1, 9, 30, 0, 123456, tzinfo=UTC),
        "day": date(2025, 3, 1),
        "order_uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "big": 1e16,
        "small": 1e-7,
        "third": 1 / 3,
        "huge_int": 2**70,
        "text": 'Überweisung 💶 \u2028 "quoted"',
        "nested": [(1, 2), {"3": None}],
        5: "integer key",
    }
    with transaction.atomic():
        audit_record(action="a.b", object_type="x", object_id="é/1", after=awkward)

    stored = AuditEvent.objects.get().after
    assert stored is not None
    assert stored["amount"] == "1234.50"
    assert stored["when"] == "2025-03-01T09:30:00.123456Z"
    assert stored["order_uuid"] == "12345678-1234-5678-1234-567812345678"
    assert stored["5"] == "integer key"
    assert audit_verify_database().ok


def test_it_refuses_values_it_cannot_store_faithfully() -> None:
    with pytest.raises(TypeError, match="bytes"), transaction.atomic():
        audit_record(action="a.b", object_type="x", object_id=1, after={"blob": b"\x00"})

    assert not AuditEvent.objects.exists()


def test_a_rolled_back_transaction_leaves_no_event_and_no_gap() -> None:
    with transaction.atomic():
        audit_record(action="a.first", object_type="x", object_id=1)

    class Abandoned(Exception):
        pass

    def doomed_change() -> None:
        with transaction.atomic():
            audit_record(action="a.doomed", object_type="x", object_id=2)
            raise Abandoned

    with pytest.raises(Abandoned):
        doomed_change()

    with transaction.atomic():
        audit_record(action="a.second", object_type="x", object_id=3)

    assert list(AuditEvent.objects.values_list("sequence", "action")) == [
        (1, "a.first"),
        (2, "a.second"),
    ]
    assert audit_verify_database().ok


@pytest.mark.django_db(transaction=True)
def test_it_refuses_to_record_outside_a_transaction() -> None:
    with pytest.raises(RuntimeError, match=r"transaction\.atomic"):
        audit_record(action="a.b", object_type="x", object_id=1)

    assert not AuditEvent.objects.exists()


def test_a_user_with_a_history_cannot_be_deleted() -> None:
    olivia = UserFactory.create()
    with transaction.atomic():
        audit_record(action="a.b", object_type="x", object_id=1, actor=olivia)

    with pytest.raises(ProtectedError):
        olivia.delete()

    assert User.objects.filter(pk=olivia.pk).exists()


def test_it_verifies_the_database_in_small_batches() -> None:
    record_events(12, UserFactory.create())

    result = audit_verify_database(batch_size=5)

    assert result.ok
    assert result.count == 12
    assert result.last_hash == AuditEvent.objects.get(sequence=12).hash


class TestTamperDrillsOnAnExportedCopy:
    """Twenty real events, copied out as an export would be, then tampered with."""

    @pytest.fixture(autouse=True)
    def events(self) -> None:
        record_events(20, UserFactory.create())

    def test_the_untouched_copy_verifies(self) -> None:
        result = verify(exported_copy(), start_sequence=1, expected_last_sequence=20)

        assert result.ok
        assert result.count == 20
        assert result.last_hash == AuditEvent.objects.get(sequence=20).hash

    def test_it_detects_an_edited_field(self) -> None:
        events = exported_copy()
        events[6]["after"]["amount"] = "1050.00"

        result = verify(events, start_sequence=1)

        assert not result.ok
        assert result.first_bad_sequence == 7
        assert result.reason == "hash does not match the event's content"

    def test_it_detects_an_edit_with_a_recomputed_hash(self) -> None:
        events = exported_copy()
        events[6]["actor_label"] = "someone.else"
        events[6]["hash"] = event_hash(events[6], events[6]["prev_hash"])

        result = verify(events, start_sequence=1)

        assert not result.ok
        assert result.first_bad_sequence == 8
        assert "prev_hash" in result.reason

    def test_it_detects_a_deleted_row(self) -> None:
        events = exported_copy()
        del events[11]

        result = verify(events, start_sequence=1)

        assert not result.ok
        assert result.first_bad_sequence == 12
        assert result.reason == "sequence 12 is missing (next event is 13)"

    def test_it_detects_two_swapped_rows(self) -> None:
        events = exported_copy()
        events[4], events[5] = events[5], events[4]

        result = verify(events, start_sequence=1)

        assert not result.ok
        assert result.first_bad_sequence == 5

    def test_it_detects_swapped_rows_even_when_renumbered(self) -> None:
        events = exported_copy()
        events[4], events[5] = events[5], events[4]
        events[4]["sequence"], events[5]["sequence"] = 5, 6

        result = verify(events, start_sequence=1)

        assert not result.ok
        assert result.first_bad_sequence == 5

    def test_it_detects_a_truncated_tail_against_the_expected_end(self) -> None:
        head = AuditEvent.objects.get(sequence=20).hash
        events = exported_copy()[:17]

        silent = verify(events, start_sequence=1)
        by_count = verify(events, start_sequence=1, expected_last_sequence=20)
        by_head = verify(events, start_sequence=1, expected_head=head)

        assert silent.ok
        assert not by_count.ok
        assert by_count.first_bad_sequence == 18
        assert not by_head.ok
        assert "head" in by_head.reason
