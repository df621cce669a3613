"""Database triggers that keep published workflow versions immutable.

UPDATE and DELETE of a row whose status is 'published' are refused with an IntegrityError
(PostgreSQL SQLSTATE 23001, SQLite ABORT), so nothing can change what a run pinned.
Caveat for SQLite: a later migration that rebuilds the table drops these triggers and must
install them again.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db.backends.base.base import BaseDatabaseWrapper

TABLE = "workflows_workflowversion"

# No percent signs: Django's psycopg cursor reads them as placeholders even without parameters.
POSTGRESQL_INSTALL = [
    """
    CREATE OR REPLACE FUNCTION workflows_version_immutable() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF OLD.status = 'published' THEN
            RAISE EXCEPTION USING
                MESSAGE = 'published workflow version ' || OLD.id || ' is immutable',
                ERRCODE = 'restrict_violation';
        END IF;
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
        RETURN NEW;
    END
    $$
    """,
    f"""
    CREATE TRIGGER workflows_version_immutable
    BEFORE UPDATE OR DELETE ON {TABLE}
    FOR EACH ROW EXECUTE FUNCTION workflows_version_immutable()
    """,
]
POSTGRESQL_DROP = [
    f"DROP TRIGGER IF EXISTS workflows_version_immutable ON {TABLE}",
    "DROP FUNCTION IF EXISTS workflows_version_immutable()",
]
SQLITE_INSTALL = [
    f"""
    CREATE TRIGGER workflows_version_immutable_update BEFORE UPDATE ON {TABLE}
    WHEN OLD.status = 'published'
    BEGIN SELECT RAISE(ABORT, 'published workflow versions are immutable'); END
    """,
    f"""
    CREATE TRIGGER workflows_version_immutable_delete BEFORE DELETE ON {TABLE}
    WHEN OLD.status = 'published'
    BEGIN SELECT RAISE(ABORT, 'published workflow versions are immutable'); END
    """,
]
SQLITE_DROP = [
    "DROP TRIGGER IF EXISTS workflows_version_immutable_update",
    "DROP TRIGGER IF EXISTS workflows_version_immutable_delete",
]


def _statements(connection: BaseDatabaseWrapper, *, install: bool) -> list[str]:
    if connection.vendor == "postgresql":
        return POSTGRESQL_INSTALL if install else POSTGRESQL_DROP
    if connection.vendor == "sqlite":
        return SQLITE_INSTALL if install else SQLITE_DROP
    raise NotImplementedError(f"no immutability triggers for {connection.vendor}")


def install_immutability_triggers(connection: BaseDatabaseWrapper) -> None:
    with connection.cursor() as cursor:
        for statement in _statements(connection, install=True):
            cursor.execute(statement)


def drop_immutability_triggers(connection: BaseDatabaseWrapper) -> None:
    with connection.cursor() as cursor:
        for statement in _statements(connection, install=False):
            cursor.execute(statement)


@contextmanager
def immutability_suspended(connection: BaseDatabaseWrapper) -> Iterator[None]:
    """Drop the triggers for the block, then put them back (test clean-up only)."""
    drop_immutability_triggers(connection)
    try:
        yield
    finally:
        install_immutability_triggers(connection)
