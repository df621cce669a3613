"""The Content-Security-Policy in a real Chromium: the main pages load, htmx requests and the
websockets work, and the browser reports no violation of the policy."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import ConsoleMessage, Page, expect

from pandaweb.core.roles import Role
from tests.e2e.conftest import Stack
from tests.e2e.test_dashboard import log_in

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

# Recorded by the page itself: the browser fires this event for every blocked resource, inline
# script, inline style or eval, whether or not it also prints a console message.
RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", function (event) {
  window.__cspViolations.push(event.violatedDirective + " " + event.blockedURI);
});
"""


def violations(page: Page, console: list[str]) -> list[Any]:
    recorded = page.evaluate("window.__cspViolations || []")
    return [*recorded, *(m for m in console if "Content Security Policy" in m)]


def test_the_main_pages_run_under_the_policy_without_a_violation(page: Page, stack: Stack) -> None:
    stack.manage("demo_workflow")
    run_id = stack.manage(
        "shell", "-c", "from tests.factories import waiting_run; print(waiting_run().pk)"
    ).split()[-1]
    console: list[str] = []
    page.on("console", lambda message: console.append(_text(message)))
    page.on("pageerror", lambda error: console.append(f"pageerror {error}"))
    page.add_init_script(RECORD_VIOLATIONS)

    page.goto(f"{stack.url}/login/")
    assert violations(page, console) == []
    log_in(page, stack, Role.ADMINS)

    paths = [
        "/",
        "/workflows/",
        "/workflows/acme-pay-invoice/",
        "/workflows/import/",
        "/workflows/credentials/",
        "/runs/launch/acme-pay-invoice/",
        "/runs/",
        f"/runs/{run_id}/",
        "/approvals/",
        f"/audit/runs/{run_id}/",
        "/system/",
        "/no-such-page/",
        "/admin/",
    ]
    for path in paths:
        run_page = path == f"/runs/{run_id}/"
        if run_page:
            # run.js opens the run's own stream; the origin check must let it through.
            with page.expect_websocket(lambda s: f"/ws/runs/{run_id}/" in s.url) as opened:
                response = page.goto(f"{stack.url}{path}")
            run_socket = opened.value
        else:
            response = page.goto(f"{stack.url}{path}")
        assert response is not None
        assert response.headers.get("content-security-policy"), path
        if not path.startswith("/admin/"):
            # The navigation's badge goes live over /ws/nav/ (Admins see approvals).
            expect(page.locator("#needs-badge[data-live]")).to_be_attached(timeout=10_000)
        assert violations(page, console) == [], (path, violations(page, console))
        if run_page:
            assert not run_socket.is_closed()

    # An htmx request under the policy: the chain is verified in place.
    page.goto(f"{stack.url}/audit/")
    page.get_by_role("button", name="Verify the chain now").click()
    expect(page.locator("#chain-status")).to_contain_text("Intact.", timeout=10_000)
    assert violations(page, console) == []
    assert not any("error" in line.lower() for line in console if line.startswith("pageerror"))


def _text(message: ConsoleMessage) -> str:
    return f"{message.type}: {message.text}"
