"""What every websocket consumer shares."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from channels.db import database_sync_to_async

P = ParamSpec("P")
R = TypeVar("R")

# Each read takes a connection from the process's pool and gives it back after: a few threads
# bound how many of them consumer reads hold at once, not the loop's default pool (up to 32).
READ_THREADS = 4
_reads = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="consumer-reads")


def read_only(func: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
    """A consumer's database read, on one of ``READ_THREADS`` threads.

    ``database_sync_to_async`` runs on daphne's one thread for sync code, where every HTTP view
    runs too: behind a burst of launches and decisions a page's websocket handshake waited more
    than daphne's 5 s and was refused. Reads need no ordering with that thread's writes (each
    sees what was committed), so they run beside it. Like a request, each read starts with a
    working connection (one the server closed is replaced) and gives it back when done.
    """
    return database_sync_to_async(func, thread_sensitive=False, executor=_reads)
