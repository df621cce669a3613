"""Django's PostgreSQL backend, with one change to how its pool hands out connections.

psycopg_pool can check each connection it hands out, but after a failed check it waits 1 s, then
2 s, 4 s… before it tries the next one. After the server closed every idle connection (a restart,
a failover, an idle timeout in front of it), a process holding four or five of them would keep
its next request waiting past the pool's timeout. Here the pool does not check; this backend
checks what it is given, and on a failure has the pool sweep all its idle connections at once
(``ConnectionPool.check``) and asks again.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        connection = super().get_new_connection(conn_params)
        pool: ConnectionPool | None = self.pool  # type: ignore[attr-defined]  # not in the stubs
        if pool is None:
            return connection
        try:
            pool.check_connection(connection)
        except psycopg.Error:
            pool.putconn(connection)  # a broken one is discarded and replaced
            pool.check()
            connection = super().get_new_connection(conn_params)
        return connection
