"""Request headers several operations take, declared once so they read the same everywhere."""

from __future__ import annotations

from typing import Any

from ninja import Header


def idempotency_key(same: str, result: str) -> Any:
    """The ``Idempotency-Key`` header of an operation that makes something: retried with the
    same key and ``same``, it answers ``result`` again (200); with anything else, 409."""
    return Header(
        "",
        alias="Idempotency-Key",
        max_length=100,
        description=f"Retry safely: the same key and {same} return {result} (200); the same key "
        f"with another {same.split()[-1]} is a 409.",
    )
