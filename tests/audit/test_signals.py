"""Sign-ins, sign-outs, failed sign-ins and role or permission changes are in the trail."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission
from django.test import Client

from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from tests.factories import PASSWORD, user_with_role

pytestmark = pytest.mark.django_db


def test_signing_in_out_and_failing_are_recorded_with_the_address() -> None:
    user = user_with_role(Role.OPERATORS, username="olivia")
    client = Client(REMOTE_ADDR="127.0.0.5")

    client.post("/login/", {"username": "olivia", "password": "wrong"})
    client.post("/login/", {"username": "olivia", "password": PASSWORD})
    client.post("/logout/")

    sessions = ("auth.login_failed", "auth.logged_in", "auth.logged_out")
    events = list(AuditEvent.objects.filter(action__in=sessions).order_by("sequence"))
    assert [e.action for e in events] == ["auth.login_failed", "auth.logged_in", "auth.logged_out"]
    failed, signed_in, signed_out = events
    assert failed.after == {"username": "olivia"}
    assert failed.actor is None
    assert "wrong" not in str(failed.after)
    assert signed_in.actor == user
    assert signed_out.actor == user
    assert {e.client_ip for e in events} == {"127.0.0.5"}


def test_role_and_permission_changes_are_recorded_from_either_side() -> None:
    user_with_role(Role.OPERATORS, username="someone")  # creates the role groups
    user = user_with_role(None, username="newcomer")
    reviewers = Group.objects.get(name=Role.REVIEWERS.value)
    start = AuditEvent.objects.count()  # only what follows counts

    user.groups.add(reviewers)
    reviewers.user_set.remove(user)
    permission = Permission.objects.get(codename="view_audit")
    reviewers.permissions.add(permission)

    events = list(AuditEvent.objects.order_by("sequence")[start:])
    assert [(e.action, e.object_type, e.after) for e in events] == [
        ("auth.groups_changed", "user", {"added": ["Reviewers"], "of": "newcomer"}),
        ("auth.groups_changed", "user", {"removed": ["Reviewers"], "of": "newcomer"}),
        ("auth.permissions_changed", "group", {"added": [str(permission)], "of": "Reviewers"}),
    ]
