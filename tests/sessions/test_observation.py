from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator

import pytest
from PIL import Image
from playwright.sync_api import Browser, FloatRect, Page, Route, StorageState, expect

from pandaweb.demo_portal.server import PortalServer, make_server
from pandaweb.demo_portal.state import DEMO_PASSWORD, DEMO_USERNAME
from sessions.engine.aria_snapshot import parse_snapshot
from sessions.engine.observation import Element, Observation, PageWatch, observe, take
from sessions.engine.pictures import outline_target, overlay, thumbnail
from sessions.engine.reading import Box, interactive_controls
from sessions.engine.vocabulary import MASK

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


def assert_every_ref_resolves(page: Page, observation: Observation, *, every: int = 1) -> None:
    """Each ref is a selector for exactly one element, the one named (``every``: look up only
    every n-th, on pages with thousands)."""
    elements = [e for e in observation.elements if e.interactive]
    assert elements
    assert len({e.ref for e in elements}) == len(elements)
    for element in elements[::every] + elements[-1:]:
        assert element.ref is not None
        located = page.locator(element.ref)
        assert located.count() == 1, element.ref
        if element.role in {"button", "link", "checkbox"}:
            name = page.evaluate(
                "e => e.getAttribute('aria-label') || e.textContent", located.element_handle()
            )
            assert element.name in " ".join(name.split()), element.ref


def controls(observation: Observation) -> list[tuple[str, str]]:
    return [(e.role, e.name) for e in observation.elements if e.interactive]


def assert_covers_raw_snapshot(page: Page, observation: Observation) -> None:
    """Every control Playwright's own accessibility snapshot lists is listed, in its order."""
    assert controls(observation) == interactive_controls(page.aria_snapshot(mode="ai"))


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
    assert interactive_controls(snapshot) == [
        ("button", "Pay: now"),
        ("textbox", "Time"),
        ("textbox", "Date"),
        ("checkbox", 'Remember "me"'),
        ("link", "It''s"),
    ]


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

    locators = take(guarded_page, secret_values=[CANARY]).masks

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


def _pixel(jpeg: bytes, box: FloatRect | None) -> tuple[int, int, int]:
    assert box is not None
    image = Image.open(io.BytesIO(jpeg)).convert("RGB")
    pixel = image.getpixel((int(box["x"] + box["width"] / 2), int(box["y"] + box["height"] / 2)))
    assert isinstance(pixel, tuple)
    return pixel[0], pixel[1], pixel[2]


def _masked(pixel: tuple[int, int, int]) -> bool:
    # A JPEG of the mask colour, not the exact colour.
    return all(abs(have - want) <= 16 for have, want in zip(pixel, (255, 0, 255), strict=True))


@pytest.mark.browser
def test_the_watch_masks_a_picture_in_memory_where_the_fields_are(
    guarded_page: Page, demo_portal: str
) -> None:
    guarded_page.goto(f"{demo_portal}/login")
    username, password = (
        guarded_page.get_by_label("Username"),
        guarded_page.get_by_label("Password"),
    )
    username.fill(CANARY)
    password.fill(DEMO_PASSWORD)
    # Scrolled, so that viewport and document coordinates differ.
    guarded_page.set_viewport_size({"width": 1280, "height": 700})
    guarded_page.evaluate("document.body.style.minHeight = '3000px'; window.scrollTo(0, 60)")
    watch = PageWatch(guarded_page)
    mask_paths = take(guarded_page, secret_values=[CANARY], watch=watch).mask_paths
    # The page's own scripts lie about where its fields are; the watch's world is apart.
    guarded_page.evaluate(
        "Element.prototype.getBoundingClientRect = () => new DOMRect(-500, -500, 1, 1)"
    )

    jpeg = watch.masked_screenshot(mask_paths, quality=85)

    assert jpeg is not None
    assert _masked(_pixel(jpeg, username.bounding_box()))
    assert _masked(_pixel(jpeg, password.bounding_box()))
    beside = username.bounding_box()
    assert beside is not None
    beside["x"] -= beside["width"] / 2 + 10  # centred 10 px left of the field
    assert not _masked(_pixel(jpeg, beside))
    watch.close()


@pytest.mark.browser
def test_the_watch_masks_a_password_inside_a_shadow_root(page: Page) -> None:
    page.set_content(
        """<p>Sign in</p><pin-pad><span>light child</span></pin-pad>
        <script>
          const pad = document.querySelector('pin-pad').attachShadow({mode: 'open'});
          pad.innerHTML = '<label>PIN <input type="password" id="pin"></label><slot></slot>';
        </script>"""
    )
    pin = page.locator("pin-pad").locator("#pin")
    pin.fill(CANARY)
    watch = PageWatch(page)
    taken = take(page, watch=watch)

    jpeg = watch.masked_screenshot(taken.mask_paths, quality=85)

    assert len(set(taken.mask_paths)) == 1  # as a password input, and as a field holding one
    assert jpeg is not None
    assert _masked(_pixel(jpeg, pin.bounding_box()))
    watch.close()


@pytest.mark.browser
def test_the_watch_leaves_masking_a_page_with_frames_to_the_browser(
    portal_page: Page, demo_portal: str
) -> None:
    portal_page.goto(f"{demo_portal}/lab/iframe")
    watch = PageWatch(portal_page)

    assert watch.masked_screenshot(["html>body"], quality=85) is None
    watch.close()


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
    assert combobox.ref is not None
    portal_page.locator(combobox.ref).click()
    opened = observe(portal_page)
    assert "expanded" in find(opened, "combobox", "Shipping method").state
    express = find(opened, "option", "Express (next working day)")
    assert express.ref is not None
    portal_page.locator(express.ref).click()
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


@pytest.mark.browser
def test_it_keeps_the_words_of_an_open_modal(portal_page: Page, demo_portal: str) -> None:
    portal_page.goto(f"{demo_portal}/lab/modal")

    observation = observe(portal_page, secret_values=["23:30"])

    dialog = observation.text.split('-- dialog "Planned maintenance"', 1)[1]
    assert dialog.splitlines()[1] == (
        f"  text: The portal will be unavailable on Saturday, 12 December 2026, from 22:00 to "
        f"{MASK} CET."
    )
    find(observation, "button", "Close")
    assert_well_numbered(observation)


# Page scale: taken now, built later; an unchanged page is seen as such without looking again.


@pytest.mark.browser
def test_it_addresses_every_control_of_a_1000_row_table_in_half_the_snapshot(
    portal_page: Page, demo_portal: str
) -> None:
    # A 1,000-row snapshot takes seconds on a busy machine.
    portal_page.set_default_timeout(60_000)
    portal_page.goto(f"{demo_portal}/lab/transactions")

    observation = observe(portal_page)

    raw = portal_page.aria_snapshot(mode="ai")
    ours = controls(observation)
    assert ours == interactive_controls(raw)
    # A checkbox and two buttons on each of the 1,000 rows, nothing left out of the evidence.
    assert len(ours) > 3 * 1_000
    assert_every_ref_resolves(portal_page, observation, every=97)
    assert observation.omitted == 0
    assert "more elements not shown" not in observation.text
    assert observation.size_chars <= len(raw) // 2
    find(observation, "checkbox", "Select TX-01000")


@pytest.mark.browser
def test_it_masks_a_password_on_a_dense_page_from_what_was_taken(
    portal_page: Page, demo_portal: str
) -> None:
    # A 1,000-row snapshot takes seconds on a busy machine.
    portal_page.set_default_timeout(60_000)
    portal_page.goto(f"{demo_portal}/lab/transactions")
    portal_page.evaluate(
        """secret => {
          const input = document.createElement('input');
          input.type = 'password';
          input.id = 'pin';
          input.setAttribute('aria-label', 'Card PIN');
          input.value = secret;
          document.querySelector('h1').after(input);
        }""",
        CANARY,
    )
    box = portal_page.locator("#pin").bounding_box()
    assert box is not None

    taken = take(portal_page)
    png = portal_page.screenshot(mask=taken.masks, mask_color="#FF00FF")
    # The writer builds later, when the page shows something else: nothing of it is needed.
    portal_page.goto(f"{demo_portal}/invoices")
    observation = taken.build()

    pixel = (
        Image.open(io.BytesIO(png))
        .convert("RGB")
        .getpixel((int(box["x"] + box["width"] / 2), int(box["y"] + box["height"] / 2)))
    )
    assert pixel == (255, 0, 255)
    assert CANARY not in observation.to_json()
    assert find(observation, "textbox", "Card PIN").value == MASK
    assert observation.url.endswith("/lab/transactions")
    assert taken.build() is observation


@pytest.mark.browser
def test_the_watch_sees_changes_and_nothing_else(portal_page: Page, demo_portal: str) -> None:
    portal_page.goto(f"{demo_portal}/lab/products")
    watch = PageWatch(portal_page)
    first = watch.mark()
    assert first is not None
    assert watch.mark() == first
    # Kept out of the page's reach: its own scripts cannot read or reset the counter.
    assert portal_page.evaluate("typeof globalThis.__pandawebChanges") == "undefined"

    portal_page.evaluate("document.querySelector('h1').textContent += '!'")
    changed = watch.mark()
    assert changed not in (None, first)
    assert watch.mark() == changed

    portal_page.evaluate("window.scrollTo(0, 200)")
    scrolled = watch.mark()
    assert scrolled not in (None, changed)

    portal_page.get_by_role("button", name="Add to cart").first.focus()
    focused = watch.mark()
    assert focused not in (None, scrolled)

    portal_page.goto(f"{demo_portal}/lab/products")
    assert watch.mark() not in (None, focused)


@pytest.mark.browser
def test_a_cross_origin_frame_is_said_to_be_unread_and_its_password_is_still_masked(
    browser: Browser, demo_portal: str, signed_in_state: StorageState
) -> None:
    # Another origin, answered by the browser itself (nothing leaves it), in the lab's iframe.
    other = demo_portal.replace("127.0.0.1", "localhost")
    context = browser.new_context(
        viewport={"width": 1280, "height": 900}, storage_state=signed_in_state
    )
    page = context.new_page()
    page.set_default_timeout(10_000)

    def loopback(route: Route) -> None:
        if route.request.url.startswith(demo_portal):
            route.continue_()
        elif route.request.url.startswith(other):
            route.fulfill(
                content_type="text/html",
                body='<label>Password <input type="password" id="pin"></label>',
            )
        else:
            route.abort()

    page.route("**/*", loopback)
    page.goto(f"{demo_portal}/lab/iframe")
    page.locator("iframe").evaluate("(frame, src) => { frame.src = src; }", f"{other}/login")
    password = page.frame_locator("iframe").get_by_label("Password")
    password.fill(CANARY)

    taken = take(page)
    png = page.screenshot(mask=taken.masks, mask_color="#FF00FF")
    observation = taken.build()
    # Read after the picture: on a loaded host the frame may still have been laying out when
    # the field was filled, and the mask is placed where the field is at the picture.
    box = password.bounding_box()
    assert box is not None

    assert "(a cross-origin frame: its content is not observed)" in observation.text
    assert CANARY not in observation.to_json()
    pixel = (
        Image.open(io.BytesIO(png))
        .convert("RGB")
        .getpixel((int(box["x"] + box["width"] / 2), int(box["y"] + box["height"] / 2)))
    )
    assert pixel == (255, 0, 255)
    context.close()


@pytest.mark.browser
def test_the_page_cannot_hide_a_password_from_the_observer(
    guarded_page: Page, demo_portal: str
) -> None:
    guarded_page.goto(f"{demo_portal}/login")
    guarded_page.get_by_label("Password").fill(CANARY)
    # The page's own scripts can lie to code running beside them; the observer's world is apart.
    guarded_page.evaluate(
        """() => {
          Object.defineProperty(HTMLInputElement.prototype, 'value', {get() { return ''; }});
          window.getComputedStyle = () => ({display: 'none'});
        }"""
    )
    guarded_page.get_by_label("Username").fill(f"{CANARY}-and-more")

    observation = observe(guarded_page)

    assert find(observation, "textbox", "Password").value == MASK
    assert find(observation, "textbox", "Username").value == MASK
    assert CANARY not in observation.to_json()


@pytest.mark.browser
def test_taking_the_page_is_not_a_change_of_it(portal_page: Page, demo_portal: str) -> None:
    portal_page.goto(f"{demo_portal}/lab/products")
    watch = PageWatch(portal_page)
    before = watch.mark()

    take(portal_page, watch=watch)

    assert before is not None
    assert watch.mark() == before
