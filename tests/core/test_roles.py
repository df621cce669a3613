from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.test import Client

from pandaweb.core.roles import DEMO_USERS, ROLE_CAPABILITIES, Capability, Role
from pandaweb.core.services import demo_users_ensure, roles_sync
from tests.factories import PASSWORD, user_with_role

pytestmark = pytest.mark.django_db

PAGES = {
    "/workflows/": Capability.VIEW_WORKFLOWS,
    "/runs/": Capability.VIEW_RUNS,
    "/approvals/": Capability.VIEW_APPROVALS,
    "/audit/": Capability.VIEW_AUDIT,
    "/webhooks/": Capability.VIEW_SYSTEM,
    "/system/": Capability.VIEW_SYSTEM,
}


def test_it_creates_each_role_with_exactly_its_capabilities() -> None:
    roles_sync()

    for role, capabilities in ROLE_CAPABILITIES.items():
        group = Group.objects.get(name=role.value)
        assert set(group.permissions.values_list("codename", flat=True)) == {
            c.value for c in capabilities
        }


def test_syncing_roles_twice_changes_nothing_and_repairs_drift() -> None:
    roles_sync()
    operators = Group.objects.get(name=Role.OPERATORS.value)
    operators.permissions.clear()

    roles_sync()
    roles_sync()

    assert Group.objects.filter(name__in=[r.value for r in Role]).count() == 4
    assert operators.permissions.count() == len(ROLE_CAPABILITIES[Role.OPERATORS])


def test_demo_users_keep_their_printed_password_across_runs(tmp_path: Path) -> None:
    password_file = tmp_path / "logins.json"

    first = demo_users_ensure(password_file=password_file)
    second = demo_users_ensure(password_file=password_file)

    assert [(d.username, d.password) for d in first] == [(d.username, d.password) for d in second]
    assert password_file.stat().st_mode & 0o777 == 0o600
    for login in first:
        user = User.objects.get(username=login.username)
        assert user.check_password(login.password)
        assert list(user.groups.values_list("name", flat=True)) == [login.role.value]


def test_the_command_prints_one_login_per_role(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    call_command("setup_roles", "--demo-users", "--password-file", str(tmp_path / "l.json"))

    out = capsys.readouterr().out
    stored = json.loads((tmp_path / "l.json").read_text())
    for username in DEMO_USERS.values():
        assert f"{username}" in out
        assert stored[username] in out


@pytest.mark.parametrize("role", list(Role))
def test_each_role_reaches_exactly_its_pages(client: Client, role: Role) -> None:
    client.force_login(user_with_role(role))

    for url, capability in PAGES.items():
        response = client.get(url)
        expected = 200 if capability in ROLE_CAPABILITIES[role] else 403
        assert response.status_code == expected, (role, url)


@pytest.mark.parametrize("role", list(Role))
def test_navigation_lists_only_the_sections_a_role_may_open(client: Client, role: Role) -> None:
    client.force_login(user_with_role(role))

    response = client.get("/")

    listed = {item.url for item in response.context["nav_items"]}
    expected = {url for url, cap in PAGES.items() if cap in ROLE_CAPABILITIES[role]}
    # Teams are an admin's to make and staff: no capability, the role itself.
    assert listed == expected | ({"/teams/"} if role == Role.ADMINS else set())


def test_a_user_without_a_role_is_refused_every_section(client: Client) -> None:
    client.force_login(user_with_role(None))

    assert client.get("/").status_code == 200
    for url in PAGES:
        assert client.get(url).status_code == 403


@pytest.mark.parametrize("url", ["/", *PAGES])
def test_anonymous_visitors_are_sent_to_login(client: Client, url: str) -> None:
    response = client.get(url)

    assert response.status_code == 302
    assert response["Location"] == f"/login/?next={url}"


def test_the_403_page_explains_and_keeps_the_shell(client: Client) -> None:
    client.force_login(user_with_role(Role.OPERATORS))

    response = client.get("/audit/")

    assert response.status_code == 403
    body = response.content.decode()
    assert "Your role does not include this page" in body
    assert 'href="/workflows/"' in body


def test_an_unknown_address_is_a_404_page(client: Client) -> None:
    client.force_login(user_with_role(Role.OPERATORS))

    response = client.get("/no/such/page/")

    assert response.status_code == 404
    assert "There is nothing at this address" in response.content.decode()


def test_a_wrong_password_shows_an_error_and_no_session(client: Client) -> None:
    user_with_role(Role.REVIEWERS, username="rory")

    response = client.post("/login/", {"username": "rory", "password": "wrong"})

    assert response.status_code == 200
    assert "Please enter a correct username and password" in response.content.decode()
    assert "_auth_user_id" not in client.session


def test_the_right_password_logs_in_through_the_form(client: Client) -> None:
    user = user_with_role(Role.REVIEWERS, username="rory")

    response = client.post("/login/", {"username": "rory", "password": PASSWORD})

    assert response.status_code == 302
    assert response["Location"] == "/"
    assert client.session["_auth_user_id"] == str(user.pk)


def test_logout_needs_a_post(client: Client) -> None:
    client.force_login(user_with_role(Role.REVIEWERS))

    assert client.get("/logout/").status_code == 405
    response = client.post("/logout/")

    assert response.status_code == 302
    assert client.get("/").status_code == 302


def test_pages_carry_the_csrf_token_for_htmx(client: Client) -> None:
    client.force_login(user_with_role(Role.ADMINS))

    body = client.get("/").content.decode()

    assert 'hx-headers=\'{"X-CSRFToken": "' in body
    assert "/static/vendor/htmx-2.0.11.min.js" in body


def test_repeated_wrong_passwords_lock_the_account_for_that_address(client: Client) -> None:
    user_with_role(Role.REVIEWERS, username="rory")
    for _ in range(5):
        client.post("/login/", {"username": "rory", "password": "wrong"})

    response = client.post("/login/", {"username": "rory", "password": PASSWORD})

    assert response.status_code == 429
    assert "Too many failed logins" in response.content.decode()
    assert "15 minutes" in response.content.decode()
    assert "_auth_user_id" not in client.session
