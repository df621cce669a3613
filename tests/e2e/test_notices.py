"""What reaches a person and what they have not seen yet, in a real Chromium at a desktop's and
a phone's width: the profile page's e-mail address and "what reaches you" sentence, and the home
page's runs that stopped before acting, until their launcher has seen them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, ViewportSize, expect

from pandaweb.core.roles import DEMO_USERS, Role
from tests.e2e.conftest import Stack
from tests.e2e.test_dashboard import log_in
from tests.e2e.test_phone import DESKTOP, PHONE, assert_no_sideways_scroll, keep

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

SIZES = pytest.mark.parametrize("size", [DESKTOP, PHONE], ids=["wide", "phone"])

# Runs of the operator that ended at their gate, as the approval services leave them (a browser
# run to each gate would take minutes; the paths there have their own tests).
STOPPED = """
import json
from datetime import timedelta
from django.contrib.auth.models import User
from django.utils import timezone
from approvals.models import ApprovalRequest
from sessions.models import Run
from workflows.models import Workflow

workflow = Workflow.objects.get(slug="acme-pay-invoice")
version = workflow.versions.order_by("-number").first()
olivia = User.objects.get(username=%(user)r)
ids = {}
for outcome, status, fields in [
    ("rejected", "rejected", {"reason": "rejected by rory.reviewer: wrong payee"}),
    ("expired", "expired", {"reason": "approval expired"}),
]:
    run = Run.objects.create(
        workflow=workflow, version=version, launched_by=olivia, status="cancelled",
        inputs={"invoice": "INV-1001"}, finished_at=timezone.now() - timedelta(days=2),
    )
    ApprovalRequest.objects.create(
        run=run, action="Click the button 'Submit payment'", status=status,
        expires_at=timezone.now() - timedelta(days=2), **fields,
    )
    ids[outcome] = run.pk
print(json.dumps(ids))
"""


@SIZES
def test_the_profile_says_what_reaches_me_and_takes_my_address(
    page: Page, stack: Stack, size: ViewportSize, tmp_path: Path
) -> None:
    page.set_viewport_size(size)
    log_in(page, stack, Role.REVIEWERS)  # the demo reviewer has no e-mail address
    page.goto(f"{stack.url}/profile/")
    summary = page.locator("#reach-summary")
    expect(summary).to_contain_text("Nothing reaches you outside this dashboard")
    expect(page.locator("#reach-email")).to_have_text("off: add an e-mail address first")
    keep(page, tmp_path, f"profile-nothing-{size['width']}.png", full_page=True)

    address = page.get_by_label("E-mail address")
    address.fill("rory at example")
    page.get_by_role("button", name="Save address").click()
    expect(page.get_by_role("alert")).to_contain_text("'rory at example' is not an e-mail address")
    expect(address).to_have_value("rory at example")
    assert_no_sideways_scroll(page)
    keep(page, tmp_path, f"profile-refused-{size['width']}.png", full_page=True)

    address.fill("rory@example.test")
    page.get_by_role("button", name="Save address").click()
    expect(
        page.get_by_text("Approval requests can now be e-mailed to rory@example.test.")
    ).to_be_visible()
    expect(summary).to_have_text(
        re.compile(
            r"Approval requests and questions for you arrive by e-mail to rory@example\.test\."
        )
    )
    expect(page.locator("#reach-email")).to_have_text("on: by e-mail to rory@example.test")
    assert_no_sideways_scroll(page)
    keep(page, tmp_path, f"profile-email-{size['width']}.png", full_page=True)

    # Back as the demo user started, for the other width (the stack is shared).
    address.fill("")
    page.get_by_role("button", name="Save address").click()
    expect(summary).to_contain_text("Nothing reaches you outside this dashboard")


@SIZES
def test_a_run_stopped_at_its_approval_stays_on_home_until_its_launcher_has_seen_it(
    page: Page, stack: Stack, size: ViewportSize, tmp_path: Path
) -> None:
    stack.manage("demo_workflow")
    printed = stack.manage("shell", "-c", STOPPED % {"user": DEMO_USERS[Role.OPERATORS]})
    ids = json.loads(printed.strip().splitlines()[-1])
    page.set_viewport_size(size)
    log_in(page, stack, Role.OPERATORS)
    stopped = page.get_by_role("list", name="Stopped before acting")
    rejected, expired = (page.locator(f"#stopped-{ids[k]}") for k in ("rejected", "expired"))
    expect(rejected).to_contain_text("Approval rejected by rory.reviewer: wrong payee")
    expect(expired).to_contain_text("Nobody decided its approval before it expired.")
    assert_no_sideways_scroll(page)
    keep(page, tmp_path, f"home-stopped-{size['width']}.png", full_page=True)

    rejected.get_by_role("button", name=f"Dismiss run #{ids['rejected']}").click()
    expect(page.get_by_text(f"Run #{ids['rejected']} is off your home page")).to_be_visible()
    expect(rejected).to_have_count(0)
    expect(expired).to_be_visible()

    expired.get_by_role("link", name=re.compile(f"#{ids['expired']} ")).click()
    expect(page).to_have_url(f"{stack.url}/runs/{ids['expired']}/")
    page.goto(f"{stack.url}/")
    expect(page.get_by_role("heading", name="Your runs")).to_be_visible()
    expect(expired).to_have_count(0)
    expect(stopped).to_have_count(0)
