"""On the live stack: an irreversible step the portal refuses ends the run failed in the
portal's words, and a confirm() accepted after approval performs the action once."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from pandaweb.core.roles import Role
from tests.e2e.conftest import Stack, workflow_import_and_publish
from tests.e2e.test_dashboard import log_in

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


def portal_api(stack: Stack, path: str, *, post: bool = False) -> Any:
    # No proxy from the environment: this request is for the loopback portal only.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    url = f"{stack.portal_url.rstrip('/')}{path}"
    with opener.open(url, data=b"" if post else None, timeout=10) as answer:
        return json.load(answer)


def publish_and_launch(
    page: Page,
    stack: Stack,
    slug: str,
    *steps: dict[str, Any],
    settings: dict[str, Any] | None = None,
) -> None:
    """Import a lab workflow through the dashboard, publish it and launch it, as an operator
    (``settings``: more workflow settings than the allowed host and the credential)."""
    portal = stack.portal_url.rstrip("/")
    document = {
        "pandaweb": 1,
        "name": f"Lab {slug}",
        "slug": slug,
        "settings": {
            "allowed_hosts": [portal.removeprefix("http://")],
            "credentials": ["acme-portal"],
            **(settings or {}),
        },
        "steps": [
            {"id": "open-login", "type": "goto", "url": f"{portal}/login"},
            {
                "id": "log-in",
                "type": "login",
                "credential": "acme-portal",
                "username": {"label": "Username"},
                "password": {"label": "Password"},
                "submit": {"role": "button", "name": "Sign in"},
            },
            *steps,
        ],
    }
    workflow_import_and_publish(page, stack, document)
    page.get_by_role("link", name="Launch v1").click()
    page.get_by_role("button", name="Launch run").click()


def approve_as_reviewer(browser: Browser, stack: Stack, action: str, expected: str) -> None:
    context = browser.new_context()
    try:
        reviewer = context.new_page()
        log_in(reviewer, stack, Role.REVIEWERS)
        reviewer.goto(f"{stack.url}/approvals/")
        reviewer.get_by_role("link", name=action).first.click()
        expect(reviewer.locator("#approval-expect")).to_have_text(expected)
        reviewer.get_by_role("button", name="Approve this action").click()
        expect(reviewer.locator("body")).to_contain_text("Approved", timeout=30_000)
    except Exception:
        print(reviewer.url, reviewer.locator("main").inner_text()[:3000], stack.log_tail(2000))
        raise
    finally:
        context.close()


def test_a_refused_approval_ends_the_run_failed_in_the_portals_words(
    page: Page, browser: Browser, stack: Stack
) -> None:
    stack.manage("demo_workflow")
    log_in(page, stack, Role.OPERATORS)
    publish_and_launch(
        page,
        stack,
        "lab-approve-invoice",
        {
            "id": "open",
            "type": "goto",
            "url": f"{stack.portal_url.rstrip('/')}/lab/approvals/INV-1033",
        },
        {
            "id": "approve",
            "type": "click",
            "irreversible": True,
            "target": {"role": "button", "name": "Approve invoice"},
            "expect": {"text": "approved for payment"},
        },
    )
    header = page.locator("#run-header")
    expect(header).to_contain_text("Awaiting approval", timeout=180_000)
    expect(page.locator("#run-expect")).to_have_text(
        "Done only when the page shows 'approved for payment'."
    )
    # While the reviewer looks, a colleague approves the same invoice in the portal.
    portal_api(stack, "/api/lab/approvals/INV-1033", post=True)

    approve_as_reviewer(
        browser,
        stack,
        "Click the button 'Approve invoice'",
        "the page shows 'approved for payment'",
    )

    expect(header).to_contain_text("Failed", timeout=120_000)
    expect(header).to_contain_text(
        "the portal refused: This invoice was already approved by colleague on"
    )
    expect(header).to_contain_text("no second approval was recorded")
    approvals = portal_api(stack, "/api/lab")["approvals"]
    assert [(a["invoice"], a["by"]) for a in approvals if a["invoice"] == "INV-1033"] == [
        ("INV-1033", "colleague")
    ]


def test_a_confirm_accepted_after_approval_performs_the_action_once(
    page: Page, browser: Browser, stack: Stack
) -> None:
    stack.manage("demo_workflow")
    log_in(page, stack, Role.OPERATORS)
    publish_and_launch(
        page,
        stack,
        "lab-remove-supplier",
        {"id": "open", "type": "goto", "url": f"{stack.portal_url.rstrip('/')}/lab/supplier"},
        {
            "id": "remove",
            "type": "click",
            "irreversible": True,
            "dialog": "accept",
            "target": {"role": "button", "name": "Remove supplier"},
            "expect": {"text": "was removed from your suppliers"},
        },
    )
    header = page.locator("#run-header")
    expect(header).to_contain_text("Awaiting approval", timeout=180_000)
    assert portal_api(stack, "/api/lab")["removed_suppliers"] == []

    approve_as_reviewer(
        browser,
        stack,
        "Click the button 'Remove supplier' and accept the dialog it opens",
        "the page shows 'was removed from your suppliers'",
    )

    expect(header).to_contain_text("Succeeded", timeout=120_000)
    expect(page.locator("#step-3 .step-dialog")).to_contain_text(
        "The page's confirm dialog said “Remove supplier Northwind Traders?"
    )
    expect(page.locator("#step-3 .step-dialog")).to_contain_text("— accepted.")
    assert portal_api(stack, "/api/lab")["removed_suppliers"] == ["Northwind Traders"]
