"""Requests per token per minute, as a sliding window counter.

The count of the current fixed window plus the previous window's count weighted by how much of it
still overlaps the sliding window: two integers per token, no list of timestamps, an error of a
few percent at most. With ``REDIS_URL`` the counters live in Redis (``INCR`` is atomic, so every
dashboard process of a scale-out shares them); in the embedded default there is one process and
they live in its memory.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    limit: int
    remaining: int
    retry_after: int  # seconds; 0 when allowed


class Counter(Protocol):
    def hit(self, key: str, window: int, now: float) -> tuple[int, int]:
        """Count a hit in the current window; return (current, previous) window counts."""
        ...


class MemoryCounter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, int], int] = {}

    def hit(self, key: str, window: int, now: float) -> tuple[int, int]:
        slot = int(now // window)
        with self._lock:
            if len(self._counts) > 10_000:
                # Old windows are useless: drop them instead of growing forever.
                self._counts = {k: v for k, v in self._counts.items() if k[1] >= slot - 1}
            current = self._counts.get((key, slot), 0) + 1
            self._counts[(key, slot)] = current
            return current, self._counts.get((key, slot - 1), 0)


class RedisCounter:
    def __init__(self, client: Any, prefix: str = "pandaweb:ratelimit") -> None:
        self._client = client
        self._prefix = prefix

    def hit(self, key: str, window: int, now: float) -> tuple[int, int]:
        slot = int(now // window)
        current_key = f"{self._prefix}:{key}:{slot}"
        pipe = self._client.pipeline()
        pipe.incr(current_key)
        pipe.expire(current_key, window * 2)
        pipe.get(f"{self._prefix}:{key}:{slot - 1}")
        current, _, previous = pipe.execute()
        return int(current), int(previous or 0)


def check(
    counter: Counter, key: str, *, limit: int, window: int = 60, now: float | None = None
) -> Verdict:
    """Count one request of ``key`` and say whether it is within ``limit`` per ``window``.

    A refused request counts too: a client hammering through its 429s stays refused.
    """
    now = time.time() if now is None else now
    current, previous = counter.hit(key, window, now)
    elapsed = (now % window) / window
    estimate = current + previous * (1 - elapsed)
    if estimate <= limit:
        return Verdict(True, limit, max(0, math.floor(limit - estimate)), 0)
    # When the estimate falls back under the limit if nothing more arrives: the previous
    # window's weight shrinks as time passes; past the window's end only ``current`` remains.
    if previous and current <= limit:
        needed = (estimate - limit) / previous  # fraction of a window
        wait = needed * window
    else:
        wait = window - (now % window)
    return Verdict(False, limit, 0, max(1, math.ceil(wait)))


_counter: Counter | None = None
_counter_lock = threading.Lock()


def default_counter() -> Counter:
    """Redis when the installation has it (shared by all processes), else this process's memory."""
    global _counter
    with _counter_lock:
        if _counter is None:
            from django.conf import settings

            if settings.REDIS_URL:
                import redis

                # Installations sharing one Redis keep apart by their queue name.
                prefix = f"{settings.CELERY_TASK_DEFAULT_QUEUE}:ratelimit"
                _counter = RedisCounter(redis.Redis.from_url(settings.REDIS_URL), prefix)
            else:
                _counter = MemoryCounter()
        return _counter
