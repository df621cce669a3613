"""The ``Idempotency-Key`` header of the operations that make something (a run, a batch, a
published version): one declaration and one refusal, so every such operation retries the same
way."""

from __future__ import annotations

from typing import Any

from ninja import Header

from pandaweb.api.problems import Problem
from sessions.services import IDEMPOTENCY_KEY_MAX_LENGTH


def idempotency_key_header(result: str, same: str = "body") -> Any:
    """The header parameter of an operation that, retried with the same key and ``same``,
    answers ``result`` again."""
    return Header(
        "",
        alias="Idempotency-Key",
        max_length=IDEMPOTENCY_KEY_MAX_LENGTH,
        description=f"Retry safely: the same key and {same} return {result} (200); the same key "
        f"with another {same} is a 409.",
    )


def key_reused(exc: Exception) -> Problem:
    """The 409 for a key used before with another request."""
    return Problem(409, str(exc), type="idempotency-key-reused")
