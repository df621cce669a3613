from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from pandaweb.core.roles import DEMO_USERS, ROLE_CAPABILITIES, Role
from tests.e2e.conftest import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

SECTIONS = {
    "Workflows": "/workflows/",
    "Runs": "/runs/",
    "Approvals": "/approvals/",
    "Audit": "/audit/",
    "System": "/system/",
}
CAPABILITY_OF = {
    "Workflows": "view_workflows",
    "Runs": "view_runs",
    "Approvals": "view_approvals",
    "Audit": "view_audit",
    "System": "view_system",
}


def log_in(page: Page, stack: Stack, role: Role) -> None:
    username = DEMO_USERS[role]
    page.goto(f"{stack.url}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(stack.logins[username])
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Good to see you")


@pytest.mark.parametrize("role", list(Role))
def test_each_role_sees_its_navigation_and_is_refused_the_rest(
    page: Page, stack: Stack, role: Role
) -> None:
    log_in(page, stack, role)

    nav = page.get_by_role("navigation", name="Main")
    allowed = {c.value for c in ROLE_CAPABILITIES[role]}
    for label, path in SECTIONS.items():
        link = nav.get_by_role("link", name=re.compile(rf"^{label}"))
        if CAPABILITY_OF[label] in allowed:
            expect(link).to_be_visible()
        else:
            expect(link).to_have_count(0)
            response = page.goto(f"{stack.url}{path}")
            assert response is not None
            assert response.status == 403
            expect(page.get_by_text("Your role does not include this page")).to_be_visible()
            page.go_back()


def test_anonymous_visitors_land_on_the_login_page(page: Page, stack: Stack) -> None:
    page.goto(f"{stack.url}/audit/")

    expect(page).to_have_url(f"{stack.url}/login/?next=/audit/")
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()


def test_a_wrong_password_is_refused(page: Page, stack: Stack) -> None:
    page.goto(f"{stack.url}/login/")
    page.get_by_label("Username").fill(DEMO_USERS[Role.REVIEWERS])
    page.get_by_label("Password").fill("not the password")
    page.get_by_role("button", name="Log in").click()

    expect(page.get_by_role("alert")).to_contain_text("Please enter a correct username")


def test_the_admin_pings_a_real_worker(page: Page, stack: Stack) -> None:
    log_in(page, stack, Role.ADMINS)
    page.goto(f"{stack.url}/system/")

    page.get_by_role("button", name="Ping workers").click()

    kind = "Celery worker" if stack.scale_out else "In-process thread"
    expect(page.locator("#heartbeats")).to_contain_text(kind, timeout=30_000)
    expect(page.locator(".facts").first).to_contain_text(
        "Celery workers" if stack.scale_out else "in-process threads"
    )


def test_the_reviewer_badge_updates_live(page: Page, stack: Stack) -> None:
    if not stack.scale_out:
        pytest.skip(
            "needs REDIS_URL: with the in-memory channel layer only the server process itself "
            "can announce a new approval, and this test creates one from outside"
        )
    log_in(page, stack, Role.REVIEWERS)
    # The server replaces the badge as soon as the websocket is open: then it is live.
    badge = page.locator("#needs-badge[data-live]")
    expect(badge).to_have_text("0")

    stack.manage(
        "shell",
        "-c",
        "from approvals.events import publish_pending_changed; "
        "from tests.factories import ApprovalRequestFactory; "
        "ApprovalRequestFactory(); publish_pending_changed()",
    )

    expect(badge).to_have_text("1", timeout=10_000)
