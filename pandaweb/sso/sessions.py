"""What a single sign-on session keeps: the provider's tokens and when to ask it again."""

from __future__ import annotations

import time
from typing import Any

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
