"""Database triggers that make the audit table append-only.

They stop the application (a bug, a careless data migration, an admin shell) from rewriting
history; they cannot stop someone who can drop them, which is what the hash chain is for.

- PostgreSQL: a row-level BEFORE UPDATE OR DELETE trigger and a statement-level BEFORE TRUNCATE
  trigger, both raising SQLSTATE 23001 (restrict_violation, an IntegrityError in Django) with a
  message naming the table. TRUNCATE of an *empty* table is let through: Django's ``flush`` (run
  after every transactional test and by ``manage.py flush``) truncates every table in one
  statement, and emptying an empty table destroys nothing.
- SQLite: BEFORE UPDATE / BEFORE DELETE triggers that ``RAISE(ABORT, …)`` (IntegrityError too).
  SQLite has no TRUNCATE; ``DELETE FROM`` on an empty table fires no row trigger.

Caveat for future migrations on SQLite: Django alters a SQLite table by rebuilding it (new table,
copy, drop, rename), which silently drops these triggers; such a migration must call
``install_append_only_triggers`` again.

The migration ``0002_append_only_triggers`` calls these functions. Changing the SQL here later
changes what a fresh database gets from 0002, so a change must also come with a migration that
reinstalls the triggers on existing databases.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db.backends.base.base import BaseDatabaseWrapper

TABLE = "audit_auditevent"
REFUSED = f"{TABLE} is append-only"

# f-strings of module constants only: nothing here comes from input. No percent signs in this
# SQL: Django's psycopg cursor reads them as placeholders even without parameters.
POSTGRESQL_INSTALL = [
    f"""
    CREATE OR REPLACE FUNCTION audit_event_append_only() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'TRUNCATE' AND NOT EXISTS (SELECT 1 FROM {TABLE}) THEN
            RETURN NULL;
        END IF;
        RAISE EXCEPTION USING
            MESSAGE = '{REFUSED}: ' || TG_OP || ' refused',
            ERRCODE = 'restrict_violation',
            HINT = 'The audit trail is only ever appended to (pandaweb.audit).';
    END
    $$
    """,  # noqa: S608
    f"""
    CREATE TRIGGER audit_event_no_update_delete
    BEFORE UPDATE OR DELETE ON {TABLE}
    FOR EACH ROW EXECUTE FUNCTION audit_event_append_only()
    """,
    f"""
    CREATE TRIGGER audit_event_no_truncate
    BEFORE TRUNCATE ON {TABLE}
    FOR EACH STATEMENT EXECUTE FUNCTION audit_event_append_only()
    """,
]
POSTGRESQL_DROP = [
    f"DROP TRIGGER IF EXISTS audit_event_no_truncate ON {TABLE}",
    f"DROP TRIGGER IF EXISTS audit_event_no_update_delete ON {TABLE}",
    "DROP FUNCTION IF EXISTS audit_event_append_only()",
]

SQLITE_INSTALL = [
    f"""
    CREATE TRIGGER audit_event_no_update BEFORE UPDATE ON {TABLE}
    BEGIN SELECT RAISE(ABORT, '{REFUSED}: UPDATE refused'); END
    """,
    f"""
    CREATE TRIGGER audit_event_no_delete BEFORE DELETE ON {TABLE}
    BEGIN SELECT RAISE(ABORT, '{REFUSED}: DELETE refused'); END
    """,
]
SQLITE_DROP = [
    "DROP TRIGGER IF EXISTS audit_event_no_update",
    "DROP TRIGGER IF EXISTS audit_event_no_delete",
]


def _statements(connection: BaseDatabaseWrapper, *, install: bool) -> list[str]:
    if connection.vendor == "postgresql":
        return POSTGRESQL_INSTALL if install else POSTGRESQL_DROP
    if connection.vendor == "sqlite":
        return SQLITE_INSTALL if install else SQLITE_DROP
    raise NotImplementedError(
        f"the audit trail has no append-only triggers for {connection.vendor}; "
        "pandaweb supports PostgreSQL and SQLite"
    )


def install_append_only_triggers(connection: BaseDatabaseWrapper) -> None:
    with connection.cursor() as cursor:
        for statement in _statements(connection, install=True):
            cursor.execute(statement)


def drop_append_only_triggers(connection: BaseDatabaseWrapper) -> None:
    with connection.cursor() as cursor:
        for statement in _statements(connection, install=False):
            cursor.execute(statement)


@contextmanager
def append_only_suspended(connection: BaseDatabaseWrapper) -> Iterator[None]:
    """Drop the triggers for the block, then put them back.

    For tamper drills and for clearing the table between tests. Anyone who can run this can also
    drop the triggers by hand; the hash chain is what catches them.
    """
    drop_append_only_triggers(connection)
    try:
        yield
    finally:
        install_append_only_triggers(connection)
