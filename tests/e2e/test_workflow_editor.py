from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, ViewportSize, expect

from pandaweb.core.roles import Role
from tests.e2e.conftest import Stack, workflow_import_and_publish
from tests.e2e.test_dashboard import log_in
from tests.e2e.test_phone import DESKTOP, PHONE, assert_no_sideways_scroll, keep

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


def add_step(page: Page, palette_label: str, fields: dict[str, str]) -> None:
    page.get_by_role("group", name="Add a step").get_by_role(
        "link", name=palette_label, exact=True
    ).click()
    form = page.locator("form.step-form")
    expect(form).to_be_visible()
    for label, value in fields.items():
        form.get_by_label(label).fill(value)
    form.get_by_role("button", name="Save step").click()
    expect(page.locator("form.step-form")).to_have_count(0)


def step_sentences(page: Page) -> list[str]:
    return page.locator("#step-list .sentence").all_inner_texts()


def test_an_operator_writes_reorders_publishes_and_compares_a_workflow(
    page: Page, stack: Stack
) -> None:
    log_in(page, stack, Role.OPERATORS)
    page.goto(f"{stack.url}/workflows/new/")
    page.get_by_label("Name").fill("Download November invoices")
    page.get_by_label("Allowed hosts").fill("127.0.0.1:8001")
    page.get_by_role("button", name="Create").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Download November invoices")

    add_step(page, "Go to a page", {"Address": "http://127.0.0.1:8001/invoices?month=2026-11"})
    add_step(page, "Click", {"Target": 'button "Submit payment"', "Step id": "pay"})
    add_step(page, "Screenshot", {"Name": "invoice_list", "Step id": "evidence"})
    assert step_sentences(page) == [
        "Go to http://127.0.0.1:8001/invoices?month=2026-11",
        "Click the button 'Submit payment'",
        "Take a screenshot 'invoice_list'",
    ]

    # A bad target is refused in place, and nothing changes.
    page.locator("#step-1").get_by_role("link", name="Edit").click()
    form = page.locator("form.step-form")
    form.get_by_label("Target").fill('buton "Pay"')
    form.get_by_role("button", name="Save step").click()
    expect(form.locator(".field-error")).to_contain_text("'buton' is not a role")
    form.get_by_label("Target").fill('button "Submit payment"')
    form.get_by_label("Irreversible: wait for a second person's approval before doing this").check()
    # An irreversible step says how the portal shows that it worked.
    form.get_by_label("Done when").select_option("url")
    form.get_by_label("Expected", exact=True).fill("**/receipts/*")
    form.get_by_role("button", name="Save step").click()
    expect(page.locator("#step-list .sentence").nth(1)).to_have_text(
        "Click the button 'Submit payment' — irreversible"
    )

    page.get_by_role("button", name="Move evidence up").click()
    expect(page.locator("#step-list .sentence").nth(1)).to_have_text(
        "Take a screenshot 'invoice_list'"
    )

    page.get_by_label("What changed").fill("First version")
    page.get_by_role("button", name=re.compile("^Publish version")).click()
    expect(page.locator(".message-success")).to_contain_text("Published version 1.")
    expect(page.get_by_role("link", name="v1", exact=True)).to_be_visible()

    page.get_by_role("button", name="Duplicate goto-1").click()
    expect(page.locator("#step-list .step")).to_have_count(4)
    page.get_by_label("What changed").fill("Second screenshot")
    page.get_by_role("button", name=re.compile("^Publish version")).click()
    expect(page.locator(".message-success")).to_contain_text("Published version 2.")

    page.get_by_role("link", name="Compare versions").click()
    page.get_by_label("From").select_option("1")
    page.get_by_label("to", exact=True).select_option("2")
    page.get_by_role("button", name="Compare").click()
    added = page.locator(".diff-added")
    expect(added).to_contain_text("Step 'goto-1-copy'")
    expect(added).to_contain_text("at position 2")


def test_a_reviewer_reads_a_workflow_without_edit_controls(page: Page, stack: Stack) -> None:
    stack.manage("demo_workflow")
    log_in(page, stack, Role.REVIEWERS)

    page.goto(f"{stack.url}/workflows/acme-pay-invoice/")

    expect(page.locator("#step-list .step-irreversible .sentence")).to_have_text(
        "Click the button 'Submit payment' — irreversible"
    )
    expect(page.get_by_role("group", name="Add a step")).to_have_count(0)
    expect(page.get_by_role("link", name="Edit")).to_have_count(0)


def test_an_operator_writes_a_session_template_in_the_editor(page: Page, stack: Stack) -> None:
    stack.manage("demo_workflow")  # the portal credential
    log_in(page, stack, Role.OPERATORS)
    page.goto(f"{stack.url}/workflows/new/")
    page.get_by_label("Name").fill("Open the invoice list")
    page.get_by_label("Allowed hosts").fill("127.0.0.1:8001")
    page.get_by_role("button", name="Create").click()
    page.get_by_role("link", name="Settings").click()
    page.get_by_label("acme-portal").check()
    page.get_by_role("button", name="Save").click()
    expect(page.locator(".message-success")).to_contain_text("Settings saved in the draft.")
    add_step(page, "Go to a page", {"Address": "http://127.0.0.1:8001/invoices"})

    page.get_by_role("link", name="Add a session template").click()
    check = page.locator("form.session-form")
    check.get_by_label("Check page").fill("http://127.0.0.1:8001/")
    check.get_by_label("Shows when logged in").fill('button "Log out"')
    check.get_by_label("Log in again every (hours)").fill("6")
    check.get_by_role("button", name="Save the check").click()
    expect(page.locator("#session-check")).to_contain_text(
        "http://127.0.0.1:8001/ must show the button 'Log out'. Logs in again every 6 h."
    )
    session_steps = page.get_by_role("group", name="Add a session step")
    expect(session_steps.get_by_role("link", name="Extract values")).to_have_count(0)
    session_steps.get_by_role("link", name="Go to a page", exact=True).click()
    form = page.locator("form.step-form")
    expect(
        form.get_by_label("Irreversible: wait for a second person's approval before doing this")
    ).to_have_count(0)
    form.get_by_label("Address").fill("http://127.0.0.1:8001/login?next={{ params.x }}")
    form.get_by_label("Step id").fill("login-page")
    form.get_by_role("button", name="Save step").click()
    expect(page.locator("#draft .problem-box")).to_contain_text(
        "session step 1 'login-page', field url: session steps run once for many runs"
    )
    page.get_by_role("link", name="Edit session step login-page").click()
    form = page.locator("form.step-form")
    form.get_by_label("Address").fill("http://127.0.0.1:8001/login")
    form.get_by_role("button", name="Save step").click()
    expect(page.locator("form.step-form")).to_have_count(0)
    session_steps.get_by_role("link", name="Log in", exact=True).click()
    form = page.locator("form.step-form")
    form.get_by_label("Credential").select_option("acme-portal")
    form.get_by_label("Submit button").fill('button "Sign in"')
    form.get_by_label("Step id").fill("log-in")
    form.get_by_role("button", name="Save step").click()
    expect(page.locator("#session-step-list .sentence")).to_have_text(
        [
            "Go to http://127.0.0.1:8001/login",
            "Log in with credential 'acme-portal', then click the button 'Sign in'",
        ]
    )
    assert step_sentences(page) == ["Go to http://127.0.0.1:8001/invoices"]

    page.get_by_label("What changed").fill("Log in once per bake")
    page.get_by_role("button", name=re.compile("^Publish version")).click()
    expect(page.locator(".message-success")).to_contain_text("Published version 1.")
    panel = page.locator("#session-template")
    expect(panel.locator(".session-steps li")).to_have_text(
        [
            "Go to http://127.0.0.1:8001/login",
            "Log in with credential 'acme-portal', then click the button 'Sign in'",
        ]
    )
    expect(panel).to_contain_text("the button 'Log out' shows at http://127.0.0.1:8001/")


@pytest.mark.parametrize("size", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_saved_settings_wait_for_publishing_and_then_apply_to_the_next_run(
    page: Page, stack: Stack, size: ViewportSize, tmp_path: Path
) -> None:
    stack.manage("demo_workflow")  # the portal credential
    page.set_viewport_size(size)
    device = "desktop" if size is DESKTOP else "phone"
    slug = f"settings-apply-{device}"
    portal = stack.portal_url.rstrip("/")
    log_in(page, stack, Role.OPERATORS)
    workflow_import_and_publish(
        page,
        stack,
        {
            "pandaweb": 1,
            "name": f"Approve an invoice ({device})",
            "slug": slug,
            "settings": {
                "allowed_hosts": [portal.removeprefix("http://")],
                "credentials": ["acme-portal"],
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
                {"id": "open", "type": "goto", "url": f"{portal}/lab/approvals/INV-1033"},
                {
                    "id": "approve",
                    "type": "click",
                    "irreversible": True,
                    "target": {"role": "button", "name": "Approve invoice"},
                    "expect": {"text": "approved for payment"},
                },
            ],
        },
    )

    page.get_by_role("link", name="Settings").click()
    page.get_by_label("Approval expires after (minutes)").fill("30")
    page.get_by_label("Remind the reviewers before expiry (minutes)").fill("10")
    assert_no_sideways_scroll(page)
    keep(page, tmp_path, f"settings-form-{device}.png", full_page=True)
    page.get_by_role("button", name="Save settings").click()

    expect(page.locator(".message-success")).to_contain_text("Settings saved in the draft")
    expect(page.get_by_text("Unpublished changes.")).to_be_visible()
    expect(page.get_by_role("button", name="Publish version 2")).to_be_visible()
    summary = page.get_by_role("region", name="Settings")
    expect(summary).to_contain_text("Runs use the settings of v1.")
    expect(summary).to_contain_text("60 min → draft: 30 min")
    expect(summary).to_contain_text("none → draft: 10 min before expiry")
    assert_no_sideways_scroll(page)
    keep(page, tmp_path, f"settings-draft-{device}.png", full_page=True)

    # The draft is not what runs use: this run waits under version 1's policy.
    waiting = launch_and_wait_for_approval(page, stack, slug, version=1)
    expect(waiting).to_contain_text(re.compile(r"expires (59|60)\s+minutes from now\."))
    cancel(page)

    page.goto(f"{stack.url}/workflows/{slug}/")
    page.get_by_label("What changed").fill("Approvals expire sooner, with a reminder")
    page.get_by_role("button", name="Publish version 2").click()
    expect(page.locator(".message-success")).to_contain_text("Published version 2.")
    expect(page.get_by_text("No unpublished changes.")).to_be_visible()
    expect(page.get_by_role("region", name="Settings")).to_contain_text(
        "Runs use the settings of v2."
    )

    waiting = launch_and_wait_for_approval(page, stack, slug, version=2)
    expect(waiting).to_contain_text(
        re.compile(
            r"expires (29|30)\s+minutes from now \(the reviewers are reminded 10 min before\)"
        )
    )
    cancel(page)


def launch_and_wait_for_approval(page: Page, stack: Stack, slug: str, *, version: int) -> Locator:
    page.goto(f"{stack.url}/workflows/{slug}/")
    page.get_by_role("link", name=f"Launch v{version}").click()
    expect(page.get_by_text(f"The run uses version {version}")).to_be_visible()
    page.get_by_role("button", name="Launch run").click()
    expect(page.locator("#run-header")).to_contain_text("Awaiting approval", timeout=180_000)
    return page.locator("#run-header .warning-box", has_text="Waiting for approval")


def cancel(page: Page) -> None:
    """Nobody decides in this test: the run gives its browser back."""
    page.get_by_role("button", name="Cancel run").click()
    expect(page.locator("#run-header")).to_contain_text("Cancel", timeout=60_000)
