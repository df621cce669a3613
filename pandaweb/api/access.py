"""The scope check every endpoint of the API starts with, shared by its routers."""

from __future__ import annotations

from django.http import HttpRequest

from pandaweb.api.problems import Problem
from pandaweb.api.scopes import Scope
from pandaweb.api.services import TokenContext


def token_with_scope(request: HttpRequest, scope: Scope) -> TokenContext:
    """The token, refused with 403 unless it has ``scope`` *and* its owner's role allows it."""
    context: TokenContext = request.auth  # type: ignore[attr-defined]
    if not context.allows(scope):
        if scope in context.scopes:
            raise Problem(
                403,
                f"the token's owner's role no longer allows '{scope.value}'",
                type="scope-beyond-role",
            )
        raise Problem(403, f"this token lacks the scope '{scope.value}'", type="missing-scope")
    return context
