from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from pandaweb.api import ratelimit
from pandaweb.api.models import ApiToken, ServiceAccount
from pandaweb.api.scopes import Scope
from pandaweb.api.services import (
    TokenError,
    service_account_create,
    token_authenticate,
    token_create,
    token_revoke,
)
from pandaweb.audit.models import AuditEvent
from pandaweb.core.models import Membership, Team
from pandaweb.core.roles import Role
from tests.api.conftest import Api
from tests.factories import user_with_role

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(db: None) -> User:
    return user_with_role(Role.ADMINS, username="ada")


def test_it_stores_only_the_hash_of_a_prefixed_secret(operator: User) -> None:
    token, raw = token_create(
        actor=operator, owner=operator, name="erp", scopes=["runs:read"], expires_at=None
    )
    token.refresh_from_db()
    assert raw.startswith("pw_")
    assert len(raw) > 40
    assert token.secret_sha256 == hashlib.sha256(raw.encode()).hexdigest()
    assert raw not in json.dumps(list(ApiToken.objects.values()), default=str)
    assert token.prefix == raw[:11]
    event = AuditEvent.objects.get(action="api_token.created")
    assert raw not in json.dumps(event.after)
    assert event.after is not None
    assert event.after["scopes"] == ["runs:read"]


def test_it_refuses_scopes_beyond_the_owners_role(reviewer: User) -> None:
    with pytest.raises(TokenError) as refused:
        token_create(
            actor=reviewer, owner=reviewer, name="x", scopes=["runs:launch"], expires_at=None
        )
    assert "runs:launch" in refused.value.field_errors["scopes"][0]
    assert not ApiToken.objects.exists()


def test_it_refuses_unknown_scopes_past_expiry_and_a_taken_name(operator: User) -> None:
    with pytest.raises(TokenError) as refused:
        token_create(
            actor=operator, owner=operator, name=" ", scopes=["root"],
            expires_at=timezone.now() - timedelta(days=1),
        )  # fmt: skip
    assert set(refused.value.field_errors) == {"name", "scopes", "expires_at"}
    token_create(actor=operator, owner=operator, name="a", scopes=["runs:read"], expires_at=None)
    with pytest.raises(TokenError):
        token_create(
            actor=operator, owner=operator, name="a", scopes=["runs:read"], expires_at=None
        )


def test_it_refuses_making_a_token_for_someone_else(operator: User, reviewer: User) -> None:
    with pytest.raises(PermissionDenied):
        token_create(actor=operator, owner=reviewer, name="x", scopes=[], expires_at=None)


def test_authentication_refuses_revoked_expired_and_inactive(operator: User) -> None:
    token, raw = token_create(
        actor=operator, owner=operator, name="t", scopes=["runs:read"],
        expires_at=timezone.now() + timedelta(days=1),
    )  # fmt: skip
    context = token_authenticate(raw)
    assert context is not None
    assert context.user == operator
    assert context.allows(Scope.RUNS_READ)
    assert not context.allows(Scope.RUNS_LAUNCH)
    assert token_authenticate(raw + "x") is None
    assert token_authenticate("Bearer " + raw) is None
    with time_machine.travel(timezone.now() + timedelta(days=2)):
        assert token_authenticate(raw) is None
    operator.is_active = False
    operator.save()
    assert token_authenticate(raw) is None
    operator.is_active = True
    operator.save()
    token_revoke(token_id=token.pk, actor=operator)
    assert token_authenticate(raw) is None
    token_revoke(token_id=token.pk, actor=operator)  # idempotent
    assert AuditEvent.objects.filter(action="api_token.revoked").count() == 1


def test_only_the_owner_or_an_admin_revokes(operator: User, reviewer: User, admin: User) -> None:
    token, _ = token_create(
        actor=operator, owner=operator, name="t", scopes=["runs:read"], expires_at=None
    )
    with pytest.raises(PermissionDenied):
        token_revoke(token_id=token.pk, actor=reviewer)
    token_revoke(token_id=token.pk, actor=admin)
    token.refresh_from_db()
    assert token.revoked_by == admin


def test_last_used_is_written_at_most_once_a_minute(operator: User) -> None:
    token, raw = token_create(
        actor=operator, owner=operator, name="t", scopes=["runs:read"], expires_at=None
    )
    token_authenticate(raw)
    token.refresh_from_db()
    first = token.last_used_at
    assert first is not None
    with CaptureQueriesContext(connection) as queries:
        token_authenticate(raw)
    assert not any(q["sql"].startswith("UPDATE") for q in queries.captured_queries)
    with time_machine.travel(first + timedelta(seconds=61)):
        token_authenticate(raw)
    token.refresh_from_db()
    assert token.last_used_at is not None
    assert token.last_used_at > first


def test_service_accounts_are_made_by_admins_and_cannot_sign_in(
    admin: User, operator: User
) -> None:
    with pytest.raises(PermissionDenied):
        service_account_create(actor=operator, username="erp", roles=["Operators"])
    account = service_account_create(actor=admin, username="erp", roles=["Operators"])
    assert not account.user.has_usable_password()
    assert not account.user.check_password("")
    with pytest.raises(PermissionDenied):
        token_create(
            actor=operator, owner=account.user, name="x", scopes=["runs:read"], expires_at=None
        )
    token, _ = token_create(
        actor=admin, owner=account.user, name="erp", scopes=["runs:launch"], expires_at=None
    )
    assert token.kind == ApiToken.Kind.SERVICE
    assert AuditEvent.objects.filter(action="service_account.created", actor=admin).exists()


# Rate limit -------------------------------------------------------------------------------------


def test_it_answers_429_with_retry_after_past_the_limit(operator: User, settings: Any) -> None:
    settings.API_RATE_LIMIT_PER_MINUTE = 3
    _, raw = token_create(
        actor=operator, owner=operator, name="t", scopes=["runs:read"], expires_at=None
    )
    api = Api(raw)
    with time_machine.travel(timezone.now().replace(second=1), tick=False):
        codes = [api.get("/runs/").status_code for _ in range(4)]
        refused = api.get("/runs/")
    assert codes == [200, 200, 200, 429]
    assert refused["Content-Type"] == "application/problem+json"
    assert 1 <= int(refused["Retry-After"]) <= 60
    # Another token of the same person has its own window.
    _, other = token_create(
        actor=operator, owner=operator, name="u", scopes=["runs:read"], expires_at=None
    )
    assert Api(other).get("/runs/").status_code == 200


def test_the_sliding_window_weighs_the_previous_minute() -> None:
    counter = ratelimit.MemoryCounter()
    for _ in range(10):
        assert ratelimit.check(counter, "k", limit=10, now=60.0 * 100 + 59).allowed
    # 15 s into the next window, 75% of the previous one still counts: 7.5 + 1.
    verdict = ratelimit.check(counter, "k", limit=10, now=60.0 * 101 + 15)
    assert verdict.allowed
    assert verdict.remaining == 1
    ratelimit.check(counter, "k", limit=10, now=60.0 * 101 + 15)
    refused = ratelimit.check(counter, "k", limit=10, now=60.0 * 101 + 15)
    assert not refused.allowed
    assert refused.retry_after >= 1


def test_the_redis_counter_shares_counts_between_processes(settings: Any) -> None:
    redis = pytest.importorskip("redis")
    import os

    url = os.environ.get("REDIS_URL")
    if not url:
        pytest.skip("needs REDIS_URL")
    client = redis.Redis.from_url(url)
    prefix = f"test-ratelimit-{os.getpid()}"
    one, two = ratelimit.RedisCounter(client, prefix), ratelimit.RedisCounter(client, prefix)
    now = 60.0 * 1000 + 5
    assert one.hit("k", 60, now) == (1, 0)
    assert two.hit("k", 60, now) == (2, 0)
    assert one.hit("k", 60, now + 60) == (1, 2)
    client.delete(*client.keys(f"{prefix}:*"))


# Dashboard pages --------------------------------------------------------------------------------


def test_the_token_page_shows_a_new_secret_once(operator: User) -> None:
    client = Client()
    client.force_login(operator)
    made = client.post("/account/tokens/", {"name": "erp", "scopes": ["runs:read", "runs:launch"]})
    assert made.status_code == 200
    token = ApiToken.objects.get()
    secret = made.context["new_secret"]
    assert secret.startswith("pw_")
    assert token_authenticate(secret) is not None
    again = client.get("/account/tokens/").content.decode()
    assert secret not in again
    assert token.prefix in again
    refused = client.post("/account/tokens/", {"name": "x", "scopes": ["approvals:decide"]})
    assert refused.status_code == 422
    assert ApiToken.objects.count() == 1
    client.post(f"/account/tokens/{token.pk}/revoke/")
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_someone_in_several_teams_limits_a_token_to_one_on_the_token_page(
    payables: Team, procurement: Team, ours: User
) -> None:
    client = Client()
    client.force_login(ours)
    assert 'name="team"' not in client.get("/account/tokens/").content.decode()

    Membership.objects.create(team=procurement, user=ours, role=Role.REVIEWERS.value)
    client = Client()
    client.force_login(ours)
    page = client.get("/account/tokens/").content.decode()
    made = client.post(
        "/account/tokens/", {"name": "buying", "scopes": ["runs:read"], "team": "procurement"}
    )

    assert "Procurement only" in page
    assert made.status_code == 200
    assert ApiToken.objects.get(name="buying").team == procurement
    assert "Procurement only" in client.get("/account/tokens/").content.decode()


def test_a_stranger_cannot_revoke_a_token_or_see_service_accounts(
    operator: User, stranger: User
) -> None:
    token, _ = token_create(
        actor=operator, owner=operator, name="t", scopes=["runs:read"], expires_at=None
    )
    client = Client()
    client.force_login(stranger)
    assert client.post(f"/account/tokens/{token.pk}/revoke/").status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None
    assert client.get("/account/service-accounts/").status_code == 403


def test_admins_make_service_accounts_and_their_tokens_on_the_page(admin: User) -> None:
    client = Client()
    client.force_login(admin)
    client.post(
        "/account/service-accounts/",
        {"form": "account", "username": "erp", "roles": ["Operators"]},
    )
    account = ServiceAccount.objects.get()
    made = client.post(
        "/account/service-accounts/",
        {"account": account.pk, "name": "erp-prod", "scopes": ["runs:launch"]},
    )
    assert made.context["new_secret"].startswith("pw_")
    assert ApiToken.objects.get().user == account.user


@pytest.mark.parametrize("role", [*Role, None])
def test_the_capabilities_read_with_a_token_agree_with_user_can(role: Role | None) -> None:
    from pandaweb.core.permissions import access_of, user_can
    from pandaweb.core.roles import Capability

    user = user_with_role(role)
    superuser = user_with_role(None, is_superuser=True)
    held = access_of([user, superuser])

    assert held[user.pk].anywhere == {c for c in Capability if user_can(user, c)}
    assert held[superuser.pk].anywhere == set(Capability)
