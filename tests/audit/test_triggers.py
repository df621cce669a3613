from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record, audit_verify_database

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("purge_audit_trail"),
]

TABLE = AuditEvent._meta.db_table

only_postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="TRUNCATE and its trigger exist only on PostgreSQL (set DATABASE_URL to run this)",
)


def record_three() -> None:
    for number in range(3):
        with transaction.atomic():
            audit_record(action="a.b", object_type="x", object_id=number)


def test_it_refuses_a_raw_update() -> None:
    record_three()

    with pytest.raises(IntegrityError, match="append-only"), connection.cursor() as cursor:
        cursor.execute(f"UPDATE {TABLE} SET action = 'a.forged' WHERE sequence = 2")  # noqa: S608

    assert AuditEvent.objects.get(sequence=2).action == "a.b"
    assert audit_verify_database().ok


def test_it_refuses_a_raw_delete() -> None:
    record_three()

    with pytest.raises(IntegrityError, match="append-only"), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {TABLE} WHERE sequence = 3")  # noqa: S608

    assert AuditEvent.objects.count() == 3


def test_it_refuses_an_orm_update_and_delete() -> None:
    record_three()

    with pytest.raises(IntegrityError):
        AuditEvent.objects.filter(sequence=1).update(actor_label="forged")
    with pytest.raises(IntegrityError):
        AuditEvent.objects.all().delete()

    assert list(AuditEvent.objects.values_list("sequence", "actor_label")) == [
        (1, "system"),
        (2, "system"),
        (3, "system"),
    ]


@only_postgresql
def test_it_refuses_truncate_on_postgresql() -> None:
    record_three()

    with pytest.raises(IntegrityError, match="TRUNCATE refused"), connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLE}")

    assert AuditEvent.objects.count() == 3


@only_postgresql
def test_it_lets_an_empty_table_be_truncated_as_djangos_flush_does() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLE}")

    assert not AuditEvent.objects.exists()
