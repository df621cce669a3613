from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator

import pytest
from PIL import Image
from playwright.sync_api import Browser, Page, Route, StorageState, expect

from pandaweb.demo_portal.server import PortalServer, make_server
from pandaweb.demo_portal.state import DEMO_PASSWORD, DEMO_USERNAME
from sessions.observation import (
    MASK,
    Box,
    Element,
    Observation,
    interactive_refs,
    observe,
    outline_target,
    overlay,
    parse_snapshot,
    secret_locators,
    thumbnail,
)

CANARY = "CANARY-7f3a9c-do-not-leak"


@pytest.fixture(scope="module")
def demo_portal() -> Iterator[str]:
    """A demo portal on a free loopback port, shared by the module (no test here pays)."""
    server: PortalServer = make_server("127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def guard(page: Page, portal: str) -> Page:
    """Abort every request that is not to the portal: nothing may leave loopback."""

    def only_portal(route: Route) -> None:
        if route.request.url.startswith((portal, "data:")):
            route.continue_()
        else:
            route.abort()

    page.route("**/*", only_portal)
    return page


def sign_in(page: Page, portal: str) -> None:
    page.goto(f"{portal}/login")
    page.get_by_label("Username").fill(DEMO_USERNAME)
    page.get_by_label("Password").fill(DEMO_PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Welcome back, Dana Fischer")).to_be_visible()
    page.get_by_role("button", name="Accept").click()
    expect(page.get_by_text("We use cookies")).to_be_hidden()


@pytest.fixture
def guarded_page(page: Page, demo_portal: str) -> Page:
    return guard(page, demo_portal)


@pytest.fixture(scope="module")
def signed_in_state(browser: Browser, demo_portal: str) -> Iterator[StorageState]:
    """Cookies of one sign-in, reused by every test: signing in is the slow part."""
    context = browser.new_context()
    sign_in(guard(context.new_page(), demo_portal), demo_portal)
    yield context.storage_state()
    context.close()


@pytest.fixture
def portal_page(
    browser: Browser, demo_portal: str, signed_in_state: StorageState
) -> Iterator[Page]:
    """A fresh context, signed in to the portal, on the dashboard."""
    context = browser.new_context(
        viewport={"width": 1280, "height": 900}, storage_state=signed_in_state
    )
    page = guard(context.new_page(), demo_portal)
    page.set_default_timeout(10_000)
    page.goto(f"{demo_portal}/")
    yield page
    context.close()


def find(observation: Observation, role: str, name: str) -> Element:
    matches = [e for e in observation.elements if e.role == role and e.name == name]
    assert len(matches) == 1, f"{role} {name!r} in:\n{observation.text}"
    return matches[0]


def assert_well_numbered(observation: Observation) -> None:
    assert [e.number for e in observation.elements] == list(range(1, len(observation.elements) + 1))


def assert_every_ref_resolves(page: Page, observation: Observation) -> None:
    refs = [e.ref for e in observation.elements if e.interactive]
    assert refs
    for ref in refs:
        assert page.locator(f"aria-ref={ref}").count() == 1, ref


def assert_covers_raw_snapshot(page: Page, observation: Observation) -> None:
    ours = {e.ref for e in observation.elements}
    missing = [ref for ref in interactive_refs(page.aria_snapshot(mode="ai")) if ref not in ours]
    assert missing == []


# --- parsing, no browser ---------------------------------------------------------------------


def test_it_parses_quoted_keys_and_values_as_text() -> None:
    snapshot = "\n".join(
        [
            "- main [ref=e1]:",
            "  - 'button \"Pay: now\" [ref=e2] [cursor=pointer]'",
            '  - textbox "Time" [ref=e3]: "1:30"',
            '  - textbox "Date" [ref=e4]: 2026-08-01',
            '  - checkbox "Remember \\"me\\"" [checked] [ref=e5]',
            "  - link \"It''s\" [ref=e6]:",
            "    - /url: /x",
        ]
    )
    (main,) = parse_snapshot(snapshot)
    button, time_box, date_box, checkbox, link = main.children
    assert (button.role, button.name, button.ref) == ("button", "Pay: now", "e2")
    assert button.attrs["cursor"] == "pointer"
    assert time_box.text == "1:30"
    assert date_box.text == "2026-08-01"
    assert checkbox.name == 'Remember "me"'
    assert "checked" in checkbox.attrs
    assert link.props == {"url": "/x"}
    assert interactive_refs(snapshot) == ["e2", "e3", "e4", "e5", "e6"]


def test_it_renders_compact_lines() -> None:
    element = Element(
        number=4, ref="e9", role="textbox", name="IBAN", value="DE89", interactive=True
    )
    assert element.render() == '[4] textbox "IBAN" = "DE89"'
    checkbox = Element(
        number=5,
        ref="e10",
        role="checkbox",
        name="Remember me",
        state=("checked",),
        interactive=True,
    )
    assert checkbox.render() == '[5] checkbox "Remember me" (checked)'
    heading = Element(number=1, ref=None, role="heading", name="Invoices", level=1)
    assert heading.render() == '## heading "Invoices" (level 1)'


# --- real pages --------------------------------------------------------------------------------


@pytest.mark.browser
def test_it_lists_the_pay_form(portal_page: Page, demo_portal: str) -> None:
    portal_page.goto(f"{demo_portal}/invoices/INV-1009/pay")
    observation = observe(portal_page)

    review = find(observation, "button", "Review payment")
    iban = find(observation, "textbox", "IBAN")
    find(observation, "textbox", "Amount (EUR)")
    find(observation, "link", "Cancel")
    find(observation, "heading", "Pay invoice INV-1009")
    assert iban.value == ""
    assert f'[{review.number}] button "Review payment"' in observation.text
    assert review.box is not None
    assert review.box.width > 0
    assert observation.title.startswith("Pay")
    assert observation.size_chars == len(observation.text)
    assert observation.token_estimate == -(-observation.size_chars // 4)
    assert_well_numbered(observation)
    assert_every_ref_resolves(portal_page, observation)
    assert_covers_raw_snapshot(portal_page, observation)


@pytest.mark.browser
def test_it_lists_the_dashboard_and_invoices(portal_page: Page, demo_portal: str) -> None:
    dashboard = observe(portal_page)
    find(dashboard, "heading", "Welcome back, Dana Fischer")
    find(dashboard, "navigation", "")
    find(dashboard, "main", "")
    find(dashboard, "link", "Invoices")
    find(dashboard, "link", "INV-1009")
    assert "-- navigation" in dashboard.text
    assert_well_numbered(dashboard)
    assert_every_ref_resolves(portal_page, dashboard)
    assert_covers_raw_snapshot(portal_page, dashboard)

    portal_page.goto(f"{demo_portal}/invoices?page=4")
    invoices = observe(portal_page)
    link = find(invoices, "link", "INV-1001")
    month = find(invoices, "combobox", "Month")
    assert month.value == "All months"
    assert "November 2026" in month.options
    # The row's other cells travel with the link, so same-named controls can be told apart.
    row = invoices.elements[link.number - 2]
    assert row.role == "row"
    assert "EUR" in row.name
    assert_well_numbered(invoices)
    assert_every_ref_resolves(portal_page, invoices)
    assert_covers_raw_snapshot(portal_page, invoices)


@pytest.mark.browser
def test_it_never_shows_a_password(guarded_page: Page, demo_portal: str) -> None:
    guarded_page.goto(f"{demo_portal}/login")
    guarded_page.get_by_label("Username").fill(DEMO_USERNAME)
    guarded_page.get_by_label("Password").fill(DEMO_PASSWORD)
    # Playwright's own snapshot prints it: the masking is ours.
    assert DEMO_PASSWORD in guarded_page.aria_snapshot(mode="ai")

    observation = observe(guarded_page)

    assert find(observation, "textbox", "Password").value == MASK
    assert find(observation, "textbox", "Username").value == DEMO_USERNAME
    assert DEMO_PASSWORD not in observation.text
    assert DEMO_PASSWORD not in observation.to_json()
    assert DEMO_PASSWORD not in json.dumps(observation.to_dict())


@pytest.mark.browser
def test_it_never_shows_a_secret_typed_into_a_normal_field(
    portal_page: Page, demo_portal: str
) -> None:
    portal_page.goto(f"{demo_portal}/invoices/INV-1009/pay")
    portal_page.get_by_label("Payment reference").fill(f"ref {CANARY} end")
    portal_page.get_by_label("IBAN").fill(CANARY)

    observation = observe(portal_page, secret_values=[CANARY])

    assert find(observation, "textbox", "IBAN").value == MASK
    assert find(observation, "textbox", "Payment reference").value == MASK
    assert CANARY not in observation.text
    assert CANARY not in observation.to_json()
    # Without being told, the same value is ordinary page content.
    assert CANARY in observe(portal_page).text


@pytest.mark.browser
def test_it_masks_secrets_in_screenshots(guarded_page: Page, demo_portal: str) -> None:
    guarded_page.goto(f"{demo_portal}/login")
    guarded_page.get_by_label("Username").fill(CANARY)
    guarded_page.get_by_label("Password").fill(DEMO_PASSWORD)

    locators = secret_locators(guarded_page, [CANARY])

    # The password field may be named twice (as a password input, and as a field holding a
    # secret); masking it twice is harmless.
    ids = {locator.get_attribute("id") or "" for locator in locators}
    assert ids == {"password", "username"}
    png = guarded_page.screenshot(mask=locators, mask_color="#FF00FF")
    box = guarded_page.get_by_label("Username").bounding_box()
    assert box is not None
    pixel = (
        Image.open(io.BytesIO(png))
        .convert("RGB")
        .getpixel((int(box["x"] + box["width"] / 2), int(box["y"] + box["height"] / 2)))
    )
    assert pixel == (255, 0, 255)


@pytest.mark.browser
def test_it_sees_into_shadow_roots_iframes_and_custom_dropdowns(
    portal_page: Page, demo_portal: str
) -> None:
    portal_page.goto(f"{demo_portal}/lab/shadow")
    shadow = observe(portal_page)
    apply = find(shadow, "button", "Apply code")
    find(shadow, "textbox", "Discount code")
    assert_every_ref_resolves(portal_page, shadow)

    portal_page.goto(f"{demo_portal}/lab/iframe")
    expect(portal_page.frame_locator("iframe").get_by_role("button", name="Save")).to_be_visible()
    framed = observe(portal_page)
    reference = find(framed, "textbox", "Supplier reference")
    save = find(framed, "button", "Save")
    assert reference.frame is not None
    assert save.frame == reference.frame
    frame_box = portal_page.locator("iframe").bounding_box()
    save_box = portal_page.frame_locator("iframe").get_by_role("button", name="Save").bounding_box()
    assert frame_box is not None
    assert save_box is not None
    assert save.box is not None
    # Boxes of iframe content are on the page, not relative to the iframe.
    assert save.box.x == pytest.approx(save_box["x"], abs=2)
    assert save.box.y == pytest.approx(save_box["y"], abs=2)
    assert_every_ref_resolves(portal_page, framed)
    assert_covers_raw_snapshot(portal_page, framed)

    portal_page.goto(f"{demo_portal}/lab/dropdown")
    closed = observe(portal_page)
    combobox = find(closed, "combobox", "Shipping method")
    assert combobox.value is not None
    assert combobox.value.startswith("Choose")
    portal_page.locator(f"aria-ref={combobox.ref}").click()
    opened = observe(portal_page)
    assert "expanded" in find(opened, "combobox", "Shipping method").state
    express = find(opened, "option", "Express (next working day)")
    portal_page.locator(f"aria-ref={express.ref}").click()
    expect(portal_page.get_by_role("status")).to_have_text("Shipping method: Express")
    assert apply.ref is not None


@pytest.mark.browser
def test_it_treats_injected_instructions_as_data(portal_page: Page, demo_portal: str) -> None:
    portal_page.goto(f"{demo_portal}/lab/injection")
    observation = observe(portal_page)
    find(observation, "heading", "Supplier notice")
    assert_well_numbered(observation)


@pytest.mark.browser
def test_it_caps_the_number_of_elements(portal_page: Page) -> None:
    observation = observe(portal_page, max_elements=5)
    assert len(observation.elements) == 5
    assert observation.omitted > 0
    assert observation.text.endswith(
        f"{observation.omitted} more elements not shown (max_elements=5)"
    )


@pytest.mark.browser
def test_overlay_draws_only_near_the_boxes(portal_page: Page, demo_portal: str) -> None:
    portal_page.goto(f"{demo_portal}/invoices/INV-1009/pay")
    observation = observe(portal_page)
    png = portal_page.screenshot()

    drawn = overlay(png, observation.elements)

    before = Image.open(io.BytesIO(png)).convert("RGB")
    after: Image.Image = Image.open(io.BytesIO(drawn))
    assert after.format == "JPEG"
    after = after.convert("RGB")
    assert after.size == before.size
    boxes = [e.box for e in observation.elements if e.box is not None]
    review = find(observation, "button", "Review payment").box
    assert review is not None
    on_border = (int(review.x + review.width / 2), int(review.y))
    assert after.getpixel(on_border) != before.getpixel(on_border)
    far = next(
        (x, y)
        for y in range(before.height - 1, 0, -20)
        for x in range(before.width - 1, 0, -20)
        if all(
            x < b.x - 40 or x > b.x + b.width + 40 or y < b.y - 40 or y > b.y + b.height + 40
            for b in boxes
        )
    )
    far_after, far_before = after.getpixel(far), before.getpixel(far)
    assert isinstance(far_after, tuple)
    assert isinstance(far_before, tuple)
    assert all(abs(a - b) <= 8 for a, b in zip(far_after, far_before, strict=True))


def test_overlay_scales_boxes_to_the_screenshot() -> None:
    blank = Image.new("RGB", (200, 100), (255, 255, 255))
    buffer = io.BytesIO()
    blank.save(buffer, format="PNG")
    element = Element(
        number=7,
        ref="e1",
        role="button",
        name="Go",
        box=Box(50, 20, 20, 10),
        interactive=True,
    )
    drawn = Image.open(io.BytesIO(overlay(buffer.getvalue(), [element], device_scale_factor=2)))
    assert drawn.convert("RGB").getpixel((120, 59)) != (255, 255, 255)  # bottom edge at 2x
    assert drawn.convert("RGB").getpixel((10, 90)) == (255, 255, 255)

    outlined = Image.open(io.BytesIO(outline_target(buffer.getvalue(), Box(50, 20, 20, 10))))
    assert outlined.size == (200, 100)
    assert outlined.convert("RGB").getpixel((48, 25)) != (255, 255, 255)
    assert outlined.convert("RGB").getpixel((60, 25)) == (255, 255, 255)  # the target stays clear


def test_thumbnail_is_a_320_wide_jpeg() -> None:
    image = Image.new("RGBA", (1280, 900), (10, 80, 160, 255))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")

    small = Image.open(io.BytesIO(thumbnail(buffer.getvalue())))

    assert small.format == "JPEG"
    assert small.size == (320, 225)
