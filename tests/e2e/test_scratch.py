"""Authoring on a live page, on the real stack in a real browser: a scratch session of a draft runs
its steps up to the payment (which it shows as skipped, never done), the author clicks the pay
button on the page's picture and puts the proposed target into the draft, and a page that loads
from a host outside the allowlist reaches nothing (a sink on that loopback address would see it).
On a copy of the demo workflow of its own."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml
from playwright.sync_api import Browser, Locator, Page, expect

from pandaweb.core.roles import Role
from pandaweb.demo_portal import lab
from pandaweb.demo_portal.state import PortalState
from tests.e2e.conftest import Stack
from tests.e2e.test_dashboard import log_in
from tests.e2e.test_phone import DESKTOP, PHONE, assert_no_sideways_scroll, keep

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

EXAMPLE = Path(__file__).resolve().parents[2] / "workflows" / "examples" / "acme-pay-invoice.yaml"
SLUG = "acme-pay-scratch"


class Sink:
    """A listener where the lab's partner page loads a pixel from (another loopback address, the
    portal's port): outside the workflow's allowlist, so a leak would knock."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((lab.OTHER_LOOPBACK_HOST, port))
        self.sock.listen()
        self.port = int(self.sock.getsockname()[1])
        self.knocks = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.knocks += 1
            conn.close()


@pytest.fixture
def sink(stack: Stack) -> Iterator[Sink]:
    listener = Sink(int(stack.portal_url.rsplit(":", 1)[1].strip("/")))
    yield listener
    listener.sock.close()


def import_draft(page: Page, stack: Stack, sink: Sink) -> str:
    """The demo workflow as a draft with defaults for every parameter, and one more step that
    opens the lab's partner page; returns the invoice the defaults pay."""
    invoice = next(i for i in PortalState().invoices() if i.status == "open")
    document = yaml.safe_load(
        EXAMPLE.read_text().replace("127.0.0.1:8001", stack.portal_url.removeprefix("http://"))
    )
    for parameter in document["parameters"]:
        parameter["default"] = {
            "invoice": invoice.number,
            "amount": f"{invoice.amount_due:.2f}",
        }.get(parameter["name"], parameter.get("default"))
    document["steps"].append(
        {"id": "partner-offers", "type": "goto", "url": f"{stack.portal_url}/lab/external"}
    )
    document |= {"slug": SLUG, "name": "Pay an Acme invoice, tried live"}
    page.goto(f"{stack.url}/workflows/import/")
    page.get_by_label("File").set_input_files(
        files={
            "name": f"{SLUG}.yaml",
            "mimeType": "application/yaml",
            "buffer": yaml.safe_dump(document).encode(),
        }
    )
    page.get_by_role("button", name="Import").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("tried live")
    return invoice.number


def row(page: Page, step_id: str) -> Locator:
    said = re.compile(rf"^{re.escape(step_id)}( ·|$)")
    return page.locator(".scratch-steps li.step").filter(
        has=page.locator(".step-id", has_text=said)
    )


def scratch_browsers() -> set[int]:
    """The processes of scratch sessions' sandboxes on this machine (any installation's)."""
    return {
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if any("/scratch-" in part for part in p.info["cmdline"] or ())
    }


def wait_ready(page: Page) -> None:
    expect(page.locator(".scratch-state")).to_have_text("Ready", timeout=120_000)


def test_a_draft_is_tried_up_to_the_payment_and_a_target_is_picked_on_the_page(
    page: Page, browser: Browser, stack: Stack, sink: Sink, tmp_path: Path
) -> None:
    stack.manage("demo_workflow")  # the portal's credential
    log_in(page, stack, Role.OPERATORS)
    invoice = import_draft(page, stack, sink)
    before = scratch_browsers()
    page.get_by_role("button", name="Try on a live page").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Try it on a live page")
    wait_ready(page)
    assert scratch_browsers() - before, "no browser runs for the scratch session"

    row(page, "submit-payment").get_by_role("button", name="Run up to here").click()
    expect(row(page, "review")).to_contain_text("Succeeded", timeout=120_000)
    wait_ready(page)
    expect(row(page, "before-paying")).to_contain_text("Succeeded")
    paid = row(page, "submit-payment")
    expect(paid).to_contain_text("Skipped: never done in a scratch session: it is irreversible")
    assert next(i for i in PortalState().invoices() if i.number == invoice).status == "open"

    # The page as the steps left it: the pay button is an element of the picture.
    pay_button = page.locator("rect.pick").filter(has=page.locator("title", has_text="Pay now"))
    if not pay_button.count():
        pay_button = page.locator("rect.pick").filter(
            has=page.locator("title", has_text="Submit payment")
        )
    pay_button.first.click()
    first = page.locator(".scratch-picked .proposals > li").first
    expect(first).to_contain_text("by its role and name, finds only this element", timeout=60_000)
    wait_ready(page)
    expect(page.locator("rect.pick.picked")).to_have_count(1)
    # The step that looks for an element of that name already is the one proposed.
    expect(first.get_by_label("Use for")).to_have_value("submit-payment:target")
    first.get_by_role("button", name="Put in the draft").click()
    expect(page.get_by_role("alert")).to_contain_text("irreversible: type its id")
    first = page.locator(".scratch-picked .proposals > li").first
    first.get_by_label("Use for").select_option("submit-payment:target")
    first.get_by_label("Irreversible step? Type its id").fill("submit-payment")
    first.get_by_role("button", name="Put in the draft").click()
    expect(page.get_by_text("Step 'submit-payment' of the draft now uses")).to_be_visible()

    # The model finds a described element on the page; it is then picked like any other.
    page.get_by_label("Find the element you describe").fill("Submit payment")
    page.get_by_role("button", name="Find it").click()
    chose = page.locator(".scratch-assist")
    expect(chose).to_contain_text("chose [", timeout=30_000)
    expect(chose).to_contain_text("button “Submit payment”")

    scratch_url = page.url
    for size, name in ((DESKTOP, "scratch-desktop.png"), (PHONE, "scratch-phone.png")):
        context = browser.new_context(viewport=size, is_mobile=size is PHONE)
        look = context.new_page()
        try:
            log_in(look, stack, Role.OPERATORS)
            look.goto(scratch_url)
            expect(look.locator(".scratch-picked")).to_be_visible()
            assert_no_sideways_scroll(look)
            look.locator(".scratch-picked").scroll_into_view_if_needed()
            keep(look, tmp_path, name)
        finally:
            context.close()

    row(page, "partner-offers").get_by_role("button", name="Try this step").click()
    expect(row(page, "partner-offers")).to_contain_text("Succeeded", timeout=60_000)
    expect(page.locator(".warning-box")).to_contain_text(lab.OTHER_LOOPBACK_HOST)
    assert sink.knocks == 0

    page.get_by_role("button", name="Close and destroy the browser").click()
    expect(page.get_by_text("The scratch session is closed")).to_be_visible()
    assert not scratch_browsers() - before, "the scratch session's browser outlived its closing"
    page.goto(scratch_url)
    expect(page.get_by_role("heading", level=1)).to_have_text("Try it on a live page")
    expect(page.get_by_text("Closed")).to_be_visible()

    # The draft, with the target picked on the page, publishes the normal way.
    page.goto(f"{stack.url}/workflows/{SLUG}/")
    page.get_by_label("What changed").fill("targets picked on the live page")
    accept = page.get_by_label("Publish anyway: the warnings above are intended")
    if accept.count():
        accept.check()
    page.get_by_role("button", name="Publish version 1").click()
    expect(page.get_by_text("Published version 1")).to_be_visible()
    # Its own file, imported again, changes nothing.
    exported = page.request.get(f"{stack.url}/workflows/{SLUG}/versions/1/export.yaml")
    assert exported.ok
    assert "name: Submit payment" in exported.text()
    page.goto(f"{stack.url}/workflows/import/")
    page.get_by_label("File").set_input_files(
        files={"name": f"{SLUG}.yaml", "mimeType": "application/yaml", "buffer": exported.body()}
    )
    page.get_by_role("button", name="Import").click()
    expect(page.get_by_text("Nothing was imported: nothing changed")).to_be_visible()
    expect(page.get_by_text("No unpublished changes")).to_be_visible()
