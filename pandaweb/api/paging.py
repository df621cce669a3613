"""Keyset cursors for the API's paged lists: an opaque token naming the last id of a page."""

from __future__ import annotations

import base64
import binascii

from pandaweb.api.problems import Problem


def cursor_encode(before_id: int) -> str:
    return base64.urlsafe_b64encode(f"r{before_id}".encode()).decode().rstrip("=")


def cursor_decode(cursor: str) -> int:
    """The id ``cursor`` names; a 422 problem on the ``cursor`` parameter when it names none."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if not text.startswith("r"):
            raise ValueError(text)
        return int(text[1:])
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise Problem(
            422, "the request is not valid", errors=[{"field": "cursor", "message": "not a cursor"}]
        ) from None


# The most items one page of a list answers.
MAX_PAGE = 200
