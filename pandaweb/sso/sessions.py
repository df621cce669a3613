"""What a single sign-on session keeps: the provider's tokens and when to ask it again."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import transaction
from django.http import HttpRequest

from pandaweb.sso.config import OidcSettings

# Session keys, not secrets.
ID_TOKEN = "sso_id_token"  # noqa: S105
REFRESH_TOKEN = "sso_refresh_token"  # noqa: S105
RECHECK_AT = "sso_recheck_at"


def tokens_remember(
    request: HttpRequest, *, oidc: OidcSettings, token: dict[str, Any], claims: dict[str, Any]
) -> None:
    """Keep the tokens of a sign-in or a refresh; the session is rechecked when its ID token
    expires or after PANDAWEB_OIDC_RECHECK_SECONDS, whichever comes first."""
    recheck_at = time.time() + oidc.recheck_seconds
    if isinstance(claims.get("exp"), int | float):
        recheck_at = min(recheck_at, float(claims["exp"]))
    request.session[ID_TOKEN] = token["id_token"]
    # A provider that rotates refresh tokens sends a new one; one that does not keeps the old.
    request.session[REFRESH_TOKEN] = token.get("refresh_token") or request.session.get(
        REFRESH_TOKEN, ""
    )
    request.session[RECHECK_AT] = recheck_at


def recheck_due(request: HttpRequest) -> bool:
    recheck_at = request.session.get(RECHECK_AT)
    return recheck_at is not None and time.time() >= float(recheck_at)


_turn_guard = threading.Lock()
_turns: weakref.WeakValueDictionary[str, threading.Lock] = weakref.WeakValueDictionary()


@contextmanager
def recheck_turn(request: HttpRequest) -> Iterator[dict[str, Any] | None]:
    """One recheck per session at a time: a page's requests often fall due together, and a
    refresh token spent twice is refused by a provider that rotates them (or answered with an ID
    token that matches the other request's access token). Yields the session as stored once the
    turn is this request's (None if another request's recheck ended it); the row lock reaches
    across server processes, the process lock covers SQLite, which has no row locks."""
    key = request.session.session_key or ""
    with _turn_guard:
        turn = _turns.get(key)
        if turn is None:
            turn = _turns[key] = threading.Lock()
    with turn, transaction.atomic():
        stored = (
            request.session.get_model_class()  # type: ignore[attr-defined]
            .objects.select_for_update()
            .filter(session_key=key)
            .first()
        )
        yield None if stored is None else request.session.decode(stored.session_data)


def recheck_adopt(request: HttpRequest, stored: dict[str, Any]) -> bool:
    """Take the tokens of a recheck another request has just made; False if none was made."""
    if stored.get(RECHECK_AT) is None or time.time() >= float(stored[RECHECK_AT]):
        return False
    for name in (ID_TOKEN, REFRESH_TOKEN, RECHECK_AT):
        request.session[name] = stored.get(name)
    return True
