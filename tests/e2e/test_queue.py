from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, ViewportSize, expect

from pandaweb.core.roles import Role
from pandaweb.demo_portal.state import PortalState
from tests.e2e.conftest import Stack
from tests.e2e.test_dashboard import log_in

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

SLUG = "acme-pay-one-at-a-time"
# The demo payment workflow under another slug, one run at a time: its first run waits for a
# reviewer holding the only slot, so the runs launched after it wait in the queue.
ONE_AT_A_TIME = f"""
from pathlib import Path
from urllib.parse import urlsplit

import yaml
from django.conf import settings
from django.contrib.auth.models import User

from workflows import services
from workflows.models import Workflow

if not Workflow.objects.filter(slug="{SLUG}").exists():
    portal = urlsplit(settings.DEMO_PORTAL_URL).netloc
    text = Path("workflows/examples/acme-pay-invoice.yaml").read_text()
    document = yaml.safe_load(text.replace("127.0.0.1:8001", portal))
    document["slug"] = "{SLUG}"
    document["name"] = "Pay one Acme invoice at a time"
    document["settings"]["max_concurrent_runs"] = 1
    author = User.objects.get(username="olivia.operator")
    workflow = services.workflow_import(user=author, text=yaml.safe_dump(document))
    services.workflow_publish(workflow_id=workflow.pk, user=author, message="One at a time")
"""


@pytest.fixture(scope="module")
def one_at_a_time(live_stack: Stack) -> Stack:
    live_stack.manage("demo_workflow")  # its portal credential
    live_stack.manage("shell", "-c", ONE_AT_A_TIME)
    return live_stack


def launch(page: Page, stack: Stack, priority: str = "Normal") -> str:
    invoice = next(i for i in PortalState().invoices() if i.status == "open")
    page.goto(f"{stack.url}/runs/launch/{SLUG}/")
    page.get_by_label("Invoice number").fill(invoice.number)
    page.get_by_label("Amount to pay").fill(f"{invoice.amount_due:.2f}")
    page.get_by_label("Priority").select_option(label=priority)
    page.get_by_role("button", name="Launch run").click()
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    return page.url


def cancel(page: Page, url: str) -> None:
    """Cancel as a person would: a click that lands while the live header is being redrawn (the
    run moving from running to awaiting approval) can miss its button, so look again and click
    again; cancelling is idempotent."""
    for _attempt in range(3):
        page.goto(url)
        button = page.get_by_role("button", name="Cancel run")
        if not button.count():
            break
        button.click()
        try:
            expect(page.locator("#run-header .status")).to_have_text("Cancelled")
            return
        except AssertionError:
            continue
    expect(page.locator("#run-header .status")).to_have_text(
        re.compile("Cancelled|Succeeded|Failed|Expired|Interrupted")
    )


VIEWPORTS: list[ViewportSize] = [{"width": 1440, "height": 900}, {"width": 390, "height": 844}]


@pytest.mark.parametrize("viewport", VIEWPORTS, ids=["wide", "phone"])
def test_a_run_over_the_limit_says_how_many_wait_ahead_then_runs(
    page: Page, one_at_a_time: Stack, viewport: ViewportSize
) -> None:
    stack = one_at_a_time
    page.set_viewport_size(viewport)
    log_in(page, stack, Role.OPERATORS)
    other = page.context.new_page()
    launched: list[str] = []

    try:
        holder = launch(other, stack)
        launched.append(holder)
        # Straight to a worker: at most "waiting for a worker to start it", never a place in line.
        expect(other.get_by_text(re.compile(r"Queued, \d+ ahead"))).to_have_count(0)
        before = launch(other, stack)
        launched.append(before)
        expect(other.locator("#run-queue")).to_have_text(re.compile(r"^Queued, 0 ahead\."))
        watched = launch(page, stack, priority="Low")
        launched.append(watched)
        queue_line = page.locator("#run-queue")
        expect(queue_line).to_have_text(re.compile(r"^Queued, 1 ahead\."))
        expect(queue_line).to_contain_text("Priority: low")
        expect(page.locator("#run-header .status")).to_have_text("Queued")
        assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]

        cancel(other, before)  # the run ahead leaves the queue: the page moves up, live
        expect(queue_line).to_have_text(re.compile(r"^Queued, 0 ahead\."))
        cancel(other, holder)  # the slot is free: the watched run gets it, live
        expect(page.locator("#run-header .status")).to_have_text(
            re.compile("Running|Awaiting approval"), timeout=120_000
        )
        expect(queue_line).to_be_hidden()
    except Exception:
        print(stack.log_tail(200))
        raise
    finally:
        # Every run launched here ends here, so no later test finds its slot taken or its approval.
        for url in launched:
            cancel(other, url)
