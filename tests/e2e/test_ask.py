"""On the live stack: a run that meets the portal's SMS code asks for it; a colleague in another
browser, whose phone got the SMS, types it on the run page; the portal takes it and the run
finishes. The launcher, not in the group asked, sees the question but no way to answer it."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from pandaweb.core.roles import Role
from tests.e2e.conftest import Stack
from tests.e2e.test_dashboard import log_in
from tests.e2e.test_outcomes import portal_api, publish_and_launch
from tests.e2e.test_phone import DESKTOP, PHONE, assert_no_sideways_scroll, keep

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


def test_a_colleague_types_the_sms_code_the_run_asks_for_and_the_portal_takes_it(
    page: Page, browser: Browser, stack: Stack, tmp_path: Path
) -> None:
    stack.manage("demo_workflow")
    portal = stack.portal_url.rstrip("/")
    log_in(page, stack, Role.OPERATORS)
    publish_and_launch(
        page, stack, "lab-sms-code",
        {"id": "open-payout-account", "type": "goto", "url": f"{portal}/lab/sms"},
        {"id": "send-sms", "type": "click",
         "target": {"role": "button", "name": "Text me a code"}},
        {"id": "ask-sms-code", "type": "ask", "answer": "code", "save_as": "sms_code",
         "question": "Type the code the Acme portal sent to the treasury phone",
         "answered_by": "Reviewers", "timeout_minutes": 15},
        {"id": "fill-sms-code", "type": "fill", "target": {"label": "SMS code"},
         "value": "{{ outputs.sms_code }}"},
        {"id": "save-account", "type": "click",
         "target": {"role": "button", "name": "Save new account"}},
        {"id": "check-changed", "type": "wait_for", "text": "Payout account changed"},
    )  # fmt: skip
    header = page.locator("#run-header")
    expect(header).to_contain_text("Waiting for an answer", timeout=180_000)
    run_url = page.url
    # The launcher is not in the group asked: the question, and why they cannot answer it.
    expect(page.locator("#question")).to_contain_text(
        "Only members of Reviewers may answer this question."
    )
    expect(page.locator("#question input[name=answer]")).to_have_count(0)

    context = browser.new_context(viewport=DESKTOP)
    try:
        colleague = context.new_page()
        log_in(colleague, stack, Role.REVIEWERS)
        colleague.get_by_role("link", name="Type the code the Acme portal sent").click()
        question = colleague.locator("#question")
        expect(question).to_contain_text("Step 5 asks Reviewers")
        code = portal_api(stack, "/api/last-code")["code"]  # what the treasury phone shows
        colleague.get_by_label("The code").fill(code)
        colleague.evaluate("window.scrollTo(0, 0)")  # the run's header, then its question
        keep(colleague, tmp_path, "run-asks-for-code.png")
        colleague.set_viewport_size(PHONE)
        colleague.reload()
        assert_no_sideways_scroll(colleague)
        colleague.get_by_label("The code").fill(code)
        keep(colleague, tmp_path, "run-asks-for-code-phone.png")
        assert colleague.get_by_label("The code").get_attribute("type") == "password"
        colleague.get_by_role("button", name="Send answer").click()
        expect(colleague.locator("body")).to_contain_text("Answer sent", timeout=30_000)
    except Exception:
        print(colleague.url, colleague.locator("main").inner_text()[:3000], stack.log_tail(2000))
        raise
    finally:
        context.close()

    expect(header).to_contain_text("Succeeded", timeout=120_000)
    assert page.url == run_url
    assert len(portal_api(stack, "/api/lab")["sms_confirmations"]) == 1
    timeline = page.locator("#timeline")
    expect(timeline).to_contain_text("answered by rory.reviewer")
    expect(timeline).to_contain_text("Fill the field labelled 'SMS code' with '••••'")
    assert code not in page.content()
