"""The provider's groups decide a person's teams: granted at sign-in, moved or taken at refresh."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import RequestFactory

from pandaweb.audit.models import AuditEvent
from pandaweb.core.models import Membership, Team
from pandaweb.core.permissions import teams_where
from pandaweb.core.roles import Capability
from pandaweb.sso import services as sso_services
from pandaweb.sso.client import SsoRefused
from pandaweb.sso.config import OidcSettings, parse_role_map
from pandaweb.sso.services import sso_session_recheck, sso_sign_in
from pandaweb.teams.services import team_create
from tests.factories import team_make

pytestmark = pytest.mark.django_db

SSO = OidcSettings(
    issuer="http://127.0.0.1:9/o",
    client_id="pandaweb",
    client_secret="secret",
    discovery_url="http://127.0.0.1:9/o/.well-known/openid-configuration",
    role_map=parse_role_map(
        "ap-ops=operators@payables,ap-review=reviewers@payables,"
        "buyers=operators@procurement,audit=compliance"
    ),
)
CLAIMS = {"sub": "subject-1", "preferred_username": "pat", "email": "pat@example.test"}


def sign_in(groups: list[str]) -> User:
    return sso_sign_in(oidc=SSO, claims=CLAIMS, groups=groups, request=RequestFactory().get("/"))


def held(user: User) -> set[tuple[str, str]]:
    return set(Membership.objects.filter(user=user).values_list("team__slug", "role"))


def test_groups_grant_roles_in_their_teams_and_make_a_team_named_for_the_first_time() -> None:
    payables = team_make("payables")

    user = sign_in(["ap-ops", "buyers", "staff"])

    assert held(user) == {("payables", "Operators"), ("procurement", "Operators")}
    procurement = Team.objects.get(slug="procurement")
    assert teams_where(user, Capability.LAUNCH_RUNS) == {payables.pk, procurement.pk}
    assert not user.groups.exists()
    event = AuditEvent.objects.get(action="auth.sso_signed_in")
    assert event.after is not None
    assert event.after["team_roles"] == ["Operators@payables", "Operators@procurement"]


def test_a_person_moved_at_the_provider_is_moved_here_at_the_next_refresh() -> None:
    user = sign_in(["ap-ops"])
    Membership.objects.create(
        team=team_make("payables"), user=user, role="Compliance"
    )  # granted here by hand: the provider is the source of truth

    sso_session_recheck(oidc=SSO, user=user, claims=CLAIMS, groups=["ap-review"])

    assert held(user) == {("payables", "Reviewers")}
    removed = AuditEvent.objects.filter(action="team.member_removed").count()
    assert removed == 2


def test_a_person_left_with_no_team_and_no_role_is_signed_out() -> None:
    user = sign_in(["ap-ops"])

    with pytest.raises(SsoRefused):
        sso_session_recheck(oidc=SSO, user=user, claims=CLAIMS, groups=["staff"])

    assert held(user) == set()


def test_a_role_in_every_team_stays_a_role_group() -> None:
    user = sign_in(["audit"])

    assert held(user) == set()
    assert teams_where(user, Capability.EXPORT_AUDIT) is None


def test_a_team_made_meanwhile_by_another_persons_first_sign_in_is_joined(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def made_by_the_other_sign_in_first(**fields: Any) -> Team:
        team_create(**fields)
        return team_create(**fields)

    monkeypatch.setattr(sso_services, "team_create", made_by_the_other_sign_in_first)

    user = sign_in(["buyers"])

    assert held(user) == {("procurement", "Operators")}
    assert Team.objects.filter(slug="procurement").count() == 1
