from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record
from pandaweb.audit.triggers import append_only_suspended

pytestmark = pytest.mark.django_db


def record(count: int) -> None:
    for number in range(count):
        with transaction.atomic():
            audit_record(action="a.b", object_type="x", object_id=number, after={"n": number})


def test_it_reports_an_intact_chain_with_its_head() -> None:
    record(5)
    out = StringIO()

    call_command("audit_verify", stdout=out)

    head = AuditEvent.objects.get(sequence=5).hash
    assert out.getvalue() == f"audit chain OK: 5 events, head {head}\n"


def test_an_empty_trail_is_intact() -> None:
    out = StringIO()

    call_command("audit_verify", stdout=out)

    assert out.getvalue() == f"audit chain OK: 0 events, head {'0' * 64}\n"


def test_it_exits_1_naming_the_sequence_of_a_tampered_row() -> None:
    record(6)
    # An attacker with database access: drop the triggers, edit a row, put the triggers back.
    with append_only_suspended(connection):
        AuditEvent.objects.filter(sequence=4).update(after={"n": 400})
    err = StringIO()

    with pytest.raises(SystemExit) as exit_info:
        call_command("audit_verify", stdout=StringIO(), stderr=err, batch_size=2)

    assert exit_info.value.code == 1
    assert err.getvalue() == (
        "audit chain BROKEN at sequence 4: hash does not match the event's content\n"
    )


def test_it_exits_1_when_a_row_was_deleted() -> None:
    record(6)
    with append_only_suspended(connection):
        AuditEvent.objects.filter(sequence=2).delete()
    err = StringIO()

    with pytest.raises(SystemExit) as exit_info:
        call_command("audit_verify", stdout=StringIO(), stderr=err)

    assert exit_info.value.code == 1
    assert "BROKEN at sequence 2: sequence 2 is missing" in err.getvalue()
