"""Tamper drills on a trail written by the real services (a workflow authored and published, runs
launched and cancelled, people signing in): each kind of tampering is caught at its sequence."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test import Client

from pandaweb.audit.exports import AuditFilter, audit_export_to_file
from pandaweb.audit.models import AuditEvent
from pandaweb.audit.triggers import append_only_suspended
from pandaweb.core.roles import Role
from sessions import services
from tests.factories import PASSWORD, user_with_role
from tests.sessions.conftest import acme_credential, demo_workflow, no_background_runs, operator
from workflows.models import Workflow

# The sessions tests' fixtures: a published demo workflow, its credential, its operator.
__all__ = ["acme_credential", "demo_workflow", "no_background_runs", "operator"]

pytestmark = pytest.mark.django_db


@pytest.fixture
def trail(operator: User, demo_workflow: Workflow) -> int:
    """A realistic trail; returns its length."""
    inputs = {"invoice": "INV-1001", "amount": "1250.00"}
    for _ in range(3):
        run = services.run_launch(workflow_id=demo_workflow.pk, user=operator, raw_inputs=inputs)
        services.run_cancel(run_id=run.pk, user=operator)
    client = Client()
    client.post("/login/", {"username": operator.get_username(), "password": "nope"})
    client.post("/login/", {"username": operator.get_username(), "password": PASSWORD})
    count = AuditEvent.objects.count()
    assert count > 12
    return count


def verify(*args: str) -> tuple[int, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("audit_verify", *args, stdout=out, stderr=err)
    except SystemExit as exit_:
        return int(exit_.code or 0), err.getvalue()
    return 0, out.getvalue()


def test_the_untouched_trail_verifies(trail: int) -> None:
    code, message = verify()
    assert code == 0
    assert f"OK: {trail} events" in message


def test_an_edited_field_is_caught_at_its_event(trail: int) -> None:
    target = trail // 2
    with append_only_suspended(connection):
        AuditEvent.objects.filter(sequence=target).update(actor_label="someone-else")

    code, message = verify()

    assert code == 1
    assert message.startswith(f"audit chain BROKEN at sequence {target}: hash does not match")


def test_a_deleted_row_is_caught_where_it_is_missing(trail: int) -> None:
    with append_only_suspended(connection):
        AuditEvent.objects.filter(sequence=5).delete()

    code, message = verify()

    assert code == 1
    assert "BROKEN at sequence 5: sequence 5 is missing" in message


def test_two_swapped_rows_are_caught_at_the_first_of_them(trail: int) -> None:
    first, second = AuditEvent.objects.get(sequence=7), AuditEvent.objects.get(sequence=8)
    with append_only_suspended(connection):
        # Exchange the two events' places in the chain (through a free sequence number).
        AuditEvent.objects.filter(pk=first.pk).update(sequence=10**9)
        AuditEvent.objects.filter(pk=second.pk).update(sequence=7)
        AuditEvent.objects.filter(pk=first.pk).update(sequence=8)

    code, message = verify()

    assert code == 1
    assert message.startswith("audit chain BROKEN at sequence 7:")


def test_a_truncated_tail_is_caught_against_an_earlier_export(trail: int, tmp_path: Path) -> None:
    compliance = user_with_role(Role.COMPLIANCE, username="carla")
    export = audit_export_to_file(user=compliance, filters=AuditFilter())
    kept = export.rename(tmp_path / "earlier.zip")
    with append_only_suspended(connection):
        AuditEvent.objects.filter(sequence__gt=trail - 3).delete()

    # Alone, a chain cut short still looks like a shorter, intact chain...
    assert verify()[0] == 0
    # ...but not against what was exported before.
    code, message = verify("--since-export", str(kept))

    assert code == 1
    assert message.startswith(f"audit chain BROKEN at sequence {trail - 2}: the chain ends at")
