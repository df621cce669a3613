"""django-oauth-toolkit's hooks at ``/oauth/token/``: the client credentials grant only, for the
clients made by ``services.oauth_client_create``, with our scope names and our token format.

What an access token may do once issued is decided where every bearer token's is:
``services.token_authenticate``.
"""

from __future__ import annotations

import base64
import binascii
import logging
import secrets
from typing import Any
from urllib.parse import unquote_plus

from oauth2_provider.models import AbstractApplication
from oauth2_provider.oauth2_validators import OAuth2Validator
from oauth2_provider.scopes import BaseScopes

from pandaweb.api import services
from pandaweb.api.models import OAuthClient
from pandaweb.api.scopes import SCOPE_LABELS, Scope

logger = logging.getLogger(__name__)


def access_token_new(request: Any) -> str:
    """An access token: a prefix of its own, so ``token_authenticate`` knows which table holds it
    and a leaked one is recognisable in a log, then 32 random bytes (as an API token's)."""
    return services.OAUTH_PREFIX + secrets.token_urlsafe(32)


def _client_of(application: AbstractApplication | None) -> OAuthClient | None:
    if application is None:
        return None
    return OAuthClient.objects.filter(application=application).first()


def _claimed_client_id(request: Any) -> str:
    """The client id a token request names, in the Basic header or the body, whether or not its
    secret matched (the library forgets the client once both ways of authenticating failed)."""
    header = request.headers.get("HTTP_AUTHORIZATION", "")
    kind, _, encoded = header.partition(" ")
    if kind == "Basic":
        try:
            decoded = base64.b64decode(encoded, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return ""
        return unquote_plus(decoded.partition(":")[0])
    return str(getattr(request, "client_id", None) or "")


class ClientCredentialsValidator(OAuth2Validator):
    """The library's validator, narrowed to the clients pandaweb made (``oauth_client_create``
    gives them the client credentials grant and no other): not revoked, owner active. A failed
    client authentication is recorded."""

    def authenticate_client(self, request: Any, *args: Any, **kwargs: Any) -> bool:
        authenticated = super().authenticate_client(request, *args, **kwargs)
        claimed = request.client.client_id if authenticated else _claimed_client_id(request)
        client = (
            OAuthClient.objects.select_related("application__user")
            .filter(application__client_id=claimed)
            .first()
        )
        if client is None:
            # No client of ours by that id: nothing to name in the audit trail, and anyone can
            # send any id, so it goes to the log only.
            logger.warning("OAuth token request for unknown client id %r", claimed[:100])
            return False
        refusal = services.oauth_client_refusal(client, secret_matched=authenticated)
        if refusal:
            services.oauth_client_authentication_failed(client=client, reason=refusal)
            return False
        return True

    def _save_bearer_token(self, token: Any, request: Any, *args: Any, **kwargs: Any) -> None:
        super()._save_bearer_token(token, request, *args, **kwargs)
        # Expired tokens are of no use: each issuance forgets its client's, so a client holds at
        # most the tokens of one lifetime and no housekeeping job is needed.
        services.oauth_tokens_forget_expired(application=request.client)


class ClientScopes(BaseScopes):
    """Our API scopes. A client may ask for the scopes it was made with (none asked: all of them);
    the owner's role bounds them again on every request, as for an API token."""

    def get_all_scopes(self) -> dict[str, str]:
        return {scope.value: SCOPE_LABELS[scope] for scope in Scope}

    def get_available_scopes(
        self, application: Any = None, request: Any = None, *args: Any, **kwargs: Any
    ) -> list[str]:
        client = _client_of(application)
        return list(client.scopes) if client is not None else []

    def get_default_scopes(
        self, application: Any = None, request: Any = None, *args: Any, **kwargs: Any
    ) -> list[str]:
        return self.get_available_scopes(application, request)
