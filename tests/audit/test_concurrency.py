from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_verify_database
from tests.audit.concurrent_writers import race

WRITERS = 8
EVENTS_PER_WRITER = 25
TOTAL = WRITERS * EVENTS_PER_WRITER


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("purge_audit_trail")
@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason=(
        "pytest-django's SQLite test database is shared-cache in-memory, where a second writer "
        "gets 'database table is locked' at once instead of waiting; the SQLite file test below "
        "covers SQLite (set DATABASE_URL to PostgreSQL to run this one)"
    ),
)
def test_concurrent_writers_extend_one_unbroken_chain() -> None:
    errors = race(WRITERS, EVENTS_PER_WRITER)

    assert errors == []
    sequences = list(AuditEvent.objects.order_by("sequence").values_list("sequence", flat=True))
    assert sequences == list(range(1, TOTAL + 1))
    assert AuditEvent.objects.values("prev_hash").distinct().count() == TOTAL
    for writer in range(WRITERS):
        assert AuditEvent.objects.filter(run_id=writer).count() == EVENTS_PER_WRITER
    result = audit_verify_database(batch_size=37)
    assert result.ok, result.reason
    assert result.count == TOTAL


@pytest.mark.slow
def test_concurrent_writers_on_a_sqlite_file_extend_one_unbroken_chain(tmp_path: Path) -> None:
    # The embedded default configuration, for real: a database file in PANDAWEB_DATA_DIR opened
    # with the project's options (BEGIN IMMEDIATE, WAL, busy timeout), in fresh processes.
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    env |= {"PANDAWEB_DATA_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "pandaweb.settings"}
    base_dir = Path(settings.BASE_DIR)

    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
        cwd=base_dir,
        env=env,
        check=True,
        timeout=180,
    )
    finished = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.audit.concurrent_writers",
            str(WRITERS),
            str(EVENTS_PER_WRITER),
        ],
        cwd=base_dir,
        env=env,
        check=True,
        timeout=180,
        capture_output=True,
        text=True,
    )

    report = json.loads(finished.stdout.strip().splitlines()[-1])
    assert report["errors"] == []
    assert report["sequences"] == list(range(1, TOTAL + 1))
    assert report["distinct_prev_hashes"] == TOTAL
    assert report["ok"], report["reason"]
    assert report["count"] == TOTAL
