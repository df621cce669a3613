"""What every websocket consumer shares."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from channels.db import database_sync_to_async

P = ParamSpec("P")
R = TypeVar("R")


def read_only(func: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
    """A consumer's database read, on a thread of the loop's pool.

    ``database_sync_to_async`` runs on daphne's one thread for sync code, where every HTTP view
    runs too: behind a burst of launches and decisions a page's websocket handshake waited more
    than daphne's 5 s and was refused. Reads need no ordering with that thread's writes (each
    sees what was committed), so they run beside it, each thread with its own connection.
    """
    return database_sync_to_async(func, thread_sensitive=False)
