from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection

from pandaweb.audit.models import AuditEvent
from pandaweb.audit.triggers import append_only_suspended


@pytest.fixture
def purge_audit_trail(transactional_db: None) -> Iterator[None]:
    """Empty the audit table after a transactional test.

    The triggers refuse the DELETE (SQLite) / TRUNCATE of a non-empty table (PostgreSQL) that
    Django's flush runs after such a test. Depending on ``transactional_db`` makes this teardown
    run before the flush.
    """
    yield
    with append_only_suspended(connection):
        AuditEvent.objects.all().delete()
