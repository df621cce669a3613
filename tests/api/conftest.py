from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from pandaweb.api import ratelimit
from pandaweb.api.scopes import Scope
from pandaweb.api.services import token_create
from pandaweb.core.roles import Role
from tests.factories import user_with_role
from tests.sessions.conftest import (
    acme_credential,
    demo_workflow,
    no_background_runs,
    operator,
    session_templates_go_first,
)

__all__ = [
    "acme_credential",
    "demo_workflow",
    "no_background_runs",
    "operator",
    "session_templates_go_first",
]

_NAMES = itertools.count(1)
ALL_SCOPES = [s.value for s in Scope]


@pytest.fixture(autouse=True)
def fresh_rate_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test counts its own requests (in memory, as in the embedded default)."""
    monkeypatch.setattr(ratelimit, "_counter", ratelimit.MemoryCounter())


@pytest.fixture
def second_reviewer(db: None) -> User:
    return user_with_role(Role.REVIEWERS, username="rita")


@pytest.fixture
def compliance(db: None) -> User:
    return user_with_role(Role.COMPLIANCE, username="carla")


@pytest.fixture
def stranger(db: None) -> User:
    """Signed in, no role at all."""
    return user_with_role(None, username="sam")


def make_token(user: User, scopes: list[str] | None = None) -> str:
    """A token of ``user`` with every scope its role allows (or exactly ``scopes``)."""
    from pandaweb.api.services import effective_scopes

    wanted = scopes if scopes is not None else [s.value for s in effective_scopes(user, ALL_SCOPES)]
    _, raw = token_create(
        actor=user, owner=user, name=f"token-{next(_NAMES)}", scopes=wanted, expires_at=None
    )
    return raw


class Api:
    """The test client speaking to /api/v1/ with one token."""

    def __init__(self, token: str) -> None:
        self.client = Client()
        self.token = token

    def _headers(self, extra: dict[str, str] | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", **(extra or {})}

    def get(self, path: str, params: dict[str, Any] | None = None, **headers: str) -> Any:
        return self.client.get(f"/api/v1{path}", params or {}, headers=self._headers(headers))

    def post(self, path: str, body: Any = None, **headers: str) -> Any:
        return self.client.post(
            f"/api/v1{path}",
            json.dumps(body if body is not None else {}),
            content_type="application/json",
            headers=self._headers(headers),
        )


@pytest.fixture
def api_for() -> Callable[..., Api]:
    def make(user: User, scopes: list[str] | None = None) -> Api:
        return Api(make_token(user, scopes))

    return make
