"""What the robot saw: a compact, numbered list of a page's controls, and pictures of them.

No Django imports: the runner calls this with a sync Playwright ``Page`` and stores the result
(``Observation.to_dict()``) with the step.

The list is built from Playwright's AI-mode accessibility snapshot
(``page.aria_snapshot(mode="ai", boxes=True)``), which already pierces open shadow roots and
includes the content of iframes, and gives every element a ref usable as
``page.locator(f"aria-ref={ref}")``. We keep what a person could interact with, plus headings,
landmarks, alerts/status messages and the text of table rows / list items that hold controls
(so that twenty "Pay" buttons can be told apart), and drop the rest.

Boxes are CSS pixels relative to the top-left corner of the viewport, i.e. what
``page.screenshot()`` (without ``full_page``) captures; multiply by the device scale factor to
get screenshot pixels (``overlay`` does that).

Secrets: the AI snapshot prints the value of password inputs in clear text. Every value found in a
password input (read right after the snapshot) and every caller-supplied secret is
redacted from names, values, the URL and the title before anything is rendered, so neither
``text`` nor ``to_dict()`` can carry one. Password inputs are found by running code in the page,
which a hostile page can fool; ``secret_values`` (what the runner typed) is the defence that holds.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from PIL import Image, ImageDraw, ImageFont
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Locator, Page

MASK = "••••"
NAME_LIMIT = 80
VALUE_LIMIT = 80
CONTEXT_LIMIT = 100
MESSAGE_LIMIT = 160
OPTIONS_SHOWN = 12

# Roles a person acts on. An element with a ref and a pointer cursor counts too: that is how
# Playwright flags clickable divs that carry no role.
INTERACTIVE_ROLES = frozenset(
    {
        "button",
        "checkbox",
        "combobox",
        "link",
        "listbox",
        "menuitem",
        "menuitemcheckbox",
        "menuitemradio",
        "option",
        "radio",
        "searchbox",
        "slider",
        "spinbutton",
        "switch",
        "tab",
        "textbox",
        "treeitem",
    }
)
VALUE_ROLES = frozenset({"textbox", "searchbox", "combobox", "spinbutton", "slider"})
# Named regions/forms only: unnamed ones are just containers.
LANDMARK_ROLES = frozenset(
    {"banner", "navigation", "main", "contentinfo", "complementary", "search", "dialog"}
    | {"alertdialog", "iframe"}
)
NAMED_LANDMARK_ROLES = frozenset({"region", "form"})
MESSAGE_ROLES = frozenset({"alert", "status"})
# Containers whose leftover text tells otherwise identical controls apart.
GROUP_ROLES = frozenset({"row", "listitem", "article"})

# Where the content of an iframe starts, in its parent frame's viewport coordinates.
_CONTENT_ORIGIN = """e => {
  const r = e.getBoundingClientRect();
  const s = getComputedStyle(e);
  return {
    x: r.x + e.clientLeft + parseFloat(s.paddingLeft || '0'),
    y: r.y + e.clientTop + parseFloat(s.paddingTop || '0'),
    width: e.clientWidth - parseFloat(s.paddingLeft || '0') - parseFloat(s.paddingRight || '0'),
    height: e.clientHeight - parseFloat(s.paddingTop || '0') - parseFloat(s.paddingBottom || '0'),
  };
}"""


class Box(NamedTuple):
    """A rectangle in CSS pixels, relative to the viewport's top-left corner."""

    x: float
    y: float
    width: float
    height: float


@dataclass(frozen=True)
class Element:
    """One line of the observation.

    ``number`` runs 1..N over all elements in document order; only interactive elements carry a
    box and show their number in ``Observation.text`` (and on the overlay).
    """

    number: int
    ref: str | None
    role: str
    name: str
    state: tuple[str, ...] = ()
    value: str | None = None
    level: int | None = None
    frame: str | None = None
    box: Box | None = None
    interactive: bool = False
    options: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "ref": self.ref,
            "role": self.role,
            "name": self.name,
            "state": list(self.state),
            "value": self.value,
            "level": self.level,
            "frame": self.frame,
            "box": None if self.box is None else self.box._asdict(),
            "interactive": self.interactive,
            "options": list(self.options),
        }

    def render(self) -> str:
        label = f'{self.role} "{_quote(self.name)}"' if self.name else self.role
        if self.interactive:
            line = f"[{self.number}] {label}"
            if self.value is not None:
                line += f' = "{_quote(self.value)}"'
            if self.options:
                shown = " | ".join(_quote(option) for option in self.options[:OPTIONS_SHOWN])
                more = len(self.options) - OPTIONS_SHOWN
                line += f" {{{shown}{f' …+{more}' if more > 0 else ''}}}"
            if self.state:
                line += f" ({', '.join(self.state)})"
            return line
        if self.role == "heading":
            return f"## {label}" + (f" (level {self.level})" if self.level else "")
        if self.role in MESSAGE_ROLES:
            return f"! {label}"
        if self.role in GROUP_ROLES:
            return f"~ {label}"
        return f"-- {label}"


@dataclass(frozen=True)
class Observation:
    url: str
    title: str
    elements: tuple[Element, ...]
    text: str
    omitted: int = 0
    size_chars: int = field(init=False)
    token_estimate: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size_chars", len(self.text))
        object.__setattr__(self, "token_estimate", math.ceil(len(self.text) / 4))

    def element(self, number: int) -> Element:
        for element in self.elements:
            if element.number == number:
                return element
        raise KeyError(number)

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "title": self.title,
            "text": self.text,
            "size_chars": self.size_chars,
            "token_estimate": self.token_estimate,
            "omitted": self.omitted,
            "elements": [element.to_dict() for element in self.elements],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)


# --- the snapshot's YAML-ish text, parsed ------------------------------------------------------


@dataclass
class SnapshotNode:
    """One node of an aria snapshot as Playwright rendered it."""

    role: str
    name: str = ""
    attrs: dict[str, str] = field(default_factory=dict)
    text: str | None = None
    props: dict[str, str] = field(default_factory=dict)
    children: list[SnapshotNode] = field(default_factory=list)

    @property
    def ref(self) -> str | None:
        return self.attrs.get("ref")

    @property
    def interactive(self) -> bool:
        return self.ref is not None and (
            self.role in INTERACTIVE_ROLES or self.attrs.get("cursor") == "pointer"
        )

    def walk(self) -> Iterator[SnapshotNode]:
        yield self
        for child in self.children:
            yield from child.walk()


_ATTR = re.compile(r"\[([a-z-]+)(?:=([^\]]*))?\]")
_DQ_ESCAPES = {"\\": "\\", '"': '"', "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def parse_snapshot(snapshot: str) -> list[SnapshotNode]:
    """Parse Playwright's aria snapshot text into a tree (top-level nodes returned).

    The format is the YAML subset written by Playwright's ``renderAriaSnapshotAsYaml``: one
    ``- key`` / ``- key: value`` / ``- key:`` item per line, two spaces per level, keys in single
    quotes and values in double quotes only when YAML needs it. A YAML library would do, but it
    would also turn unquoted values such as ``1:30`` or ``2026-08-01`` into numbers and dates.
    """
    roots: list[SnapshotNode] = []
    stack: list[tuple[int, SnapshotNode]] = []
    for raw_line in snapshot.splitlines():
        stripped = raw_line.lstrip(" ")
        if not stripped.startswith("- "):
            continue
        depth = (len(raw_line) - len(stripped)) // 2
        key, value = _split_item(stripped[2:])
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parent = stack[-1][1] if stack else None
        if key.startswith("/") and parent is not None:
            parent.props[key[1:]] = value or ""
            continue
        node = _node_from_key(key)
        if key == "text":
            node.text = value or ""
        elif value is not None:
            node.text = value
        if parent is None:
            roots.append(node)
        else:
            parent.children.append(node)
        stack.append((depth, node))
    return roots


def _split_item(item: str) -> tuple[str, str | None]:
    """Split ``key: value`` (either side possibly quoted); value None when there is none."""
    if item.startswith("'"):
        index = 1
        while index < len(item):
            if item[index] == "'":
                if item.startswith("''", index):
                    index += 2
                    continue
                break
            index += 1
        key = item[1:index].replace("''", "'")
        rest = item[index + 1 :]
    else:
        # An unquoted key never holds ": " nor ends in ":" (Playwright quotes it then).
        cut = item.find(": ")
        if cut == -1:
            if item.endswith(":"):
                return item[:-1], None
            return item, None
        key, rest = item[:cut], item[cut:]
    if rest.startswith(": "):
        return key, _unquote_value(rest[2:])
    return key, None


def _unquote_value(value: str) -> str:
    if not (len(value) >= 2 and value.startswith('"') and value.endswith('"')):
        return value
    body = value[1:-1]
    out: list[str] = []
    index = 0
    while index < len(body):
        char = body[index]
        if char == "\\" and index + 1 < len(body):
            code = body[index + 1]
            if code == "x" and index + 3 < len(body):
                out.append(chr(int(body[index + 2 : index + 4], 16)))
                index += 4
                continue
            out.append(_DQ_ESCAPES.get(code, code))
            index += 2
            continue
        out.append(char)
        index += 1
    return "".join(out)


def _node_from_key(key: str) -> SnapshotNode:
    role, _, rest = key.partition(" ")
    name = ""
    rest = rest.lstrip()
    if rest.startswith('"'):
        try:
            decoded, end = json.JSONDecoder().raw_decode(rest)
        except ValueError:
            decoded, end = "", 0
        if isinstance(decoded, str):
            name = decoded
        rest = rest[end:]
    attrs = {match.group(1): match.group(2) or "" for match in _ATTR.finditer(rest)}
    return SnapshotNode(role=role, name=name, attrs=attrs)


def interactive_refs(snapshot: str) -> list[str]:
    """Refs of every element a person could act on in a raw AI snapshot, in document order."""
    refs: list[str] = []
    for root in parse_snapshot(snapshot):
        refs.extend(node.ref for node in root.walk() if node.interactive and node.ref)
    return refs


# --- observing a page ---------------------------------------------------------------------------


class _Redactor:
    """Replaces every secret with MASK; longest first so one secret inside another goes whole."""

    def __init__(self, secrets: Collection[str]) -> None:
        self.secrets = sorted({secret for secret in secrets if secret}, key=len, reverse=True)

    def text(self, value: str) -> str:
        for secret in self.secrets:
            if secret in value:
                value = value.replace(secret, MASK)
        return value

    def touches(self, value: str) -> bool:
        return any(secret in value for secret in self.secrets)


def _password_fields(page: Page) -> tuple[set[str], list[Locator]]:
    """The password inputs of every frame and the values they hold.

    Read with ``count`` and ``input_value``, which run in Playwright's utility world: a query in
    the page's main world would make every new document pay for a second injected script, on
    every step's critical path.
    """
    values: set[str] = set()
    fields: list[Locator] = []
    for frame in page.frames:
        passwords = frame.locator("input[type=password]")
        try:
            for index in range(passwords.count()):
                field = passwords.nth(index)
                fields.append(field)
                if value := field.input_value(timeout=1_000):
                    values.add(value)
        except PlaywrightError:
            # A frame navigating away has no inputs left to leak.
            continue
    return values, fields


@dataclass(eq=False)
class _Pending:
    """An element before numbering; boxes of iframe content still frame-relative."""

    ref: str | None
    role: str
    name: str
    state: tuple[str, ...] = ()
    value: str | None = None
    level: int | None = None
    frame: tuple[str, ...] = ()
    box: Box | None = None
    interactive: bool = False
    options: tuple[str, ...] = ()
    # The landmarks (and iframes) this element lies in, outermost first.
    landmarks: tuple[_Pending, ...] = ()


class _Builder:
    def __init__(self, redactor: _Redactor) -> None:
        self.redact = redactor
        self.items: list[_Pending] = []
        self.seen_messages: set[tuple[str, str]] = set()
        # Fields whose value holds a secret: masked in the screenshot too.
        self.secret_refs: list[str] = []

    def visit(
        self,
        node: SnapshotNode,
        *,
        frame: tuple[str, ...] = (),
        landmarks: tuple[_Pending, ...] = (),
        in_group: bool = False,
    ) -> None:
        role = node.role
        if role == "text":
            return
        if node.interactive:
            self.items.append(self._control(node, frame, landmarks))
            # Options of a native <select> have no ref: they travel with the combobox. Anything
            # with a ref below a control (a custom listbox's options) is listed on its own.
            for child in node.children:
                self._visit_refs_only(child, frame=frame, landmarks=landmarks)
            return
        if role in LANDMARK_ROLES or (role in NAMED_LANDMARK_ROLES and node.name):
            landmark = _Pending(
                ref=node.ref,
                role=role,
                name=self._name(node.name),
                frame=frame,
                landmarks=landmarks,
            )
            self.items.append(landmark)
            inner = (*landmarks, landmark)
            inner_frame = (*frame, node.ref) if role == "iframe" and node.ref else frame
            for child in node.children:
                self.visit(child, frame=inner_frame, landmarks=inner)
            return
        if role == "heading":
            name = self._name(node.name or _all_text(node))
            controls = [item for item in node.walk() if item is not node and item.interactive]
            # A heading that only repeats its section's title or its own link's name is noise.
            repeats = (landmarks and landmarks[-1].name == name) or any(
                self._name(control.name or _all_text(control)) == name for control in controls
            )
            if name and not repeats:
                self.items.append(
                    _Pending(
                        ref=node.ref,
                        role=role,
                        name=name,
                        level=_int(node.attrs.get("level")),
                        frame=frame,
                        landmarks=landmarks,
                    )
                )
            for child in node.children:
                self._visit_refs_only(child, frame=frame, landmarks=landmarks)
            return
        if role in MESSAGE_ROLES:
            message = _clip(self.redact.text(node.name or _all_text(node)), MESSAGE_LIMIT)
            if message and (role, message) not in self.seen_messages:
                self.seen_messages.add((role, message))
                self.items.append(
                    _Pending(
                        ref=node.ref, role=role, name=message, frame=frame, landmarks=landmarks
                    )
                )
            for child in node.children:
                self._visit_refs_only(child, frame=frame, landmarks=landmarks)
            return
        if role in GROUP_ROLES and not in_group:
            self._visit_group(node, frame=frame, landmarks=landmarks)
            return
        for child in node.children:
            self.visit(child, frame=frame, landmarks=landmarks, in_group=in_group)

    def _visit_group(
        self, node: SnapshotNode, *, frame: tuple[str, ...], landmarks: tuple[_Pending, ...]
    ) -> None:
        start = len(self.items)
        marker = _Pending(ref=node.ref, role=node.role, name="", frame=frame, landmarks=landmarks)
        self.items.append(marker)
        for child in node.children:
            self.visit(child, frame=frame, landmarks=landmarks, in_group=True)
        inside = self.items[start + 1 :]
        context = ""
        if any(item.interactive for item in inside):
            known = {item.name for item in inside}
            context = _clip(
                self.redact.text(" · ".join(_context_texts(node, known))), CONTEXT_LIMIT
            )
        if context:
            marker.name = context
        else:
            del self.items[start]

    def _visit_refs_only(
        self, node: SnapshotNode, *, frame: tuple[str, ...], landmarks: tuple[_Pending, ...]
    ) -> None:
        if node.interactive:
            self.items.append(self._control(node, frame, landmarks))
        for child in node.children:
            self._visit_refs_only(child, frame=frame, landmarks=landmarks)

    def _control(
        self, node: SnapshotNode, frame: tuple[str, ...], landmarks: tuple[_Pending, ...]
    ) -> _Pending:
        role = node.role
        name = node.name or node.props.get("placeholder", "") or _all_text(node)
        if not name and role == "link":
            name = node.props.get("url", "")
        options = tuple(self._name(child.name) for child in node.children if child.role == "option")
        value: str | None = None
        if role in VALUE_ROLES:
            selected = [child.name for child in node.children if "selected" in child.attrs]
            raw = node.text if node.text is not None else (selected[0] if selected else "")
            # A value that holds a secret is masked whole: a half-redacted IBAN or password still
            # tells too much.
            secret = self.redact.touches(raw)
            value = MASK if secret else _clip(raw, VALUE_LIMIT)
            if secret and node.ref:
                self.secret_refs.append(node.ref)
        state = tuple(_states(node))
        return _Pending(
            ref=node.ref,
            role=role,
            name=self._name(name),
            state=state,
            value=value,
            frame=frame,
            box=_snapshot_box(node),
            interactive=True,
            options=options if role in {"combobox", "listbox"} else (),
            landmarks=landmarks,
        )

    def _name(self, name: str) -> str:
        return _clip(self.redact.text(name), NAME_LIMIT)


def _is_landmark(item: _Pending) -> bool:
    return item.role in LANDMARK_ROLES or item.role in NAMED_LANDMARK_ROLES


def _states(node: SnapshotNode) -> Iterator[str]:
    attrs = node.attrs
    for key, label in (
        ("checked", "checked"),
        ("pressed", "pressed"),
        ("selected", "selected"),
        ("expanded", "expanded"),
        ("disabled", "disabled"),
        ("invalid", "invalid"),
        ("active", "focused"),
    ):
        if key in attrs:
            yield label if attrs[key] in ("", "true") else f"{label}={attrs[key]}"


def _all_text(node: SnapshotNode) -> str:
    parts: list[str] = []
    for item in node.walk():
        if item.text:
            parts.append(item.text)
        elif item is not node and item.name:
            parts.append(item.name)
    return " ".join(" ".join(parts).split())


def _context_texts(node: SnapshotNode, known: set[str]) -> Iterator[str]:
    """Short texts inside a row/item that are not already the name of a listed element."""
    for child in node.children:
        if child.interactive or child.role in {"heading", *MESSAGE_ROLES}:
            continue
        text = child.name or child.text or ""
        if text:
            text = " ".join(text.split())
            if text not in known:
                known.add(text)
                yield text
        if not child.text:
            yield from _context_texts(child, known)


def _snapshot_box(node: SnapshotNode) -> Box | None:
    raw = node.attrs.get("box")
    if not raw:
        return None
    try:
        x, y, width, height = (float(part) for part in raw.split(","))
    except ValueError:
        return None
    if width <= 0 or height <= 0:
        return None
    return Box(x, y, width, height)


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def _clip(value: str, limit: int) -> str:
    value = " ".join(value.split())
    return value if len(value) <= limit else value[: limit - 1] + "…"


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _frame_origins(page: Page, items: Sequence[_Pending]) -> dict[tuple[str, ...], Box | None]:
    """Content rectangles of every iframe holding a kept element, in viewport coordinates.

    The snapshot's boxes inside an iframe are relative to that iframe's own viewport; one
    evaluate per iframe (not one ``bounding_box()`` per element) puts them on the page.
    """
    origins: dict[tuple[str, ...], Box | None] = {(): Box(0, 0, math.inf, math.inf)}

    def origin(path: tuple[str, ...]) -> Box | None:
        if path in origins:
            return origins[path]
        parent = origin(path[:-1])
        result: Box | None = None
        if parent is not None:
            try:
                rect = page.locator(f"aria-ref={path[-1]}").evaluate(_CONTENT_ORIGIN, timeout=1_000)
                result = Box(
                    parent.x + rect["x"], parent.y + rect["y"], rect["width"], rect["height"]
                )
            except PlaywrightError:
                result = None
        origins[path] = result
        return result

    for item in items:
        if item.frame and item.interactive:
            origin(item.frame)
    return origins


def _place(box: Box | None, area: Box | None) -> Box | None:
    """Move a frame-relative box onto the page, clipped to the frame's visible content."""
    if box is None or area is None:
        return None
    x, y = area.x + box.x, area.y + box.y
    left, top = max(x, area.x), max(y, area.y)
    right = min(x + box.width, area.x + area.width)
    bottom = min(y + box.height, area.y + area.height)
    if right <= left or bottom <= top:
        return None
    return Box(left, top, right - left, bottom - top)


@dataclass(frozen=True)
class Capture:
    """An observation plus what the runner needs to picture the same moment.

    ``snapshot`` is the raw aria snapshot with boxes: equal snapshots of one URL mean the same
    controls, texts and layout, so a step that did not touch the page can reuse the last picture.
    ``masks`` are the inputs to hide in a screenshot taken right after.
    """

    observation: Observation
    snapshot: str
    masks: list[Locator]


def observe(
    page: Page, *, secret_values: Collection[str] = (), max_elements: int = 400
) -> Observation:
    """Observe ``page``: its controls, headings, landmarks and messages, numbered 1..N.

    Elements past ``max_elements`` (in document order) are left out and counted in ``omitted``.
    Read-only: nothing on the page is clicked, typed or scrolled.
    """
    return capture(page, secret_values=secret_values, max_elements=max_elements).observation


def capture(page: Page, *, secret_values: Collection[str] = (), max_elements: int = 400) -> Capture:
    """``observe`` plus the raw snapshot and the screenshot masks."""
    secrets = [secret for secret in secret_values if secret]
    snapshot = page.aria_snapshot(mode="ai", boxes=True)
    # Read after the snapshot: a value the snapshot shows is still there (only the page's own
    # code could clear it in between, and that code knows the value anyway).
    passwords, password_inputs = _password_fields(page)
    redactor = _Redactor({*secrets, *passwords})

    builder = _Builder(redactor)
    for root in parse_snapshot(snapshot):
        builder.visit(root)
    items = builder.items

    # Landmarks (and iframes) earn a line only when something kept lies inside them.
    used: set[int] = set()
    for item in items:
        if not _is_landmark(item):
            used.update(id(landmark) for landmark in item.landmarks)
    kept = [item for item in items if not _is_landmark(item) or id(item) in used]

    omitted = max(0, len(kept) - max_elements)
    kept = kept[:max_elements]
    origins = _frame_origins(page, kept)
    elements = tuple(
        Element(
            number=number,
            ref=item.ref,
            role=item.role,
            name=item.name,
            state=item.state,
            value=item.value,
            level=item.level,
            frame=" > ".join(item.frame) or None,
            box=(item.box if not item.frame else _place(item.box, origins.get(item.frame)))
            if item.interactive
            else None,
            interactive=item.interactive,
            options=item.options,
        )
        for number, item in enumerate(kept, start=1)
    )
    # Nested sections (a form inside an iframe, a dialog inside main) are indented; top-level
    # ones are not, which saves two characters on almost every line.
    lines = [
        "  " * max(0, len(item.landmarks) - 1) + element.render()
        for item, element in zip(kept, elements, strict=True)
    ]
    if omitted:
        lines.append(f"… {omitted} more elements not shown (max_elements={max_elements})")
    observation = Observation(
        url=redactor.text(page.url),
        title=redactor.text(page.title()),
        elements=elements,
        text="\n".join(lines),
        omitted=omitted,
    )
    masks = [*password_inputs, *(page.locator(f"aria-ref={ref}") for ref in builder.secret_refs)]
    return Capture(observation=observation, snapshot=f"{page.url}\n{snapshot}", masks=masks)


def secret_locators(page: Page, secret_values: Collection[str]) -> list[Locator]:
    """Locators of inputs to mask in a screenshot: password inputs and fields holding a secret.

    Pass the result as ``page.screenshot(mask=...)`` right after calling this.
    """
    return capture(page, secret_values=secret_values).masks


# --- pictures -----------------------------------------------------------------------------------

_PALETTE = (
    (230, 25, 75),
    (0, 130, 200),
    (60, 160, 60),
    (245, 130, 48),
    (145, 30, 180),
    (0, 128, 128),
    (170, 110, 40),
    (128, 0, 0),
)


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except (OSError, ValueError):  # Pillow built without FreeType: the small bitmap font
        return ImageFont.load_default()


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=False)
    return buffer.getvalue()


def _scaled(box: Box | Sequence[float], scale: float) -> tuple[float, float, float, float]:
    x, y, width, height = box
    return x * scale, y * scale, (x + width) * scale, (y + height) * scale


def overlay(
    screenshot: bytes, elements: Sequence[Element], *, device_scale_factor: float = 1.0
) -> bytes:
    """A copy of the screenshot with a numbered outline over every element that has a box.

    Returns a JPEG of high quality: the numbers stay legible at a fraction of a PNG's encoding
    time, which matters because every step draws one. Labels sit just above a box's top-left
    corner, or just inside it when there is no room above, so every changed pixel lies within a
    label's height of a box.
    """
    image = Image.open(io.BytesIO(screenshot)).convert("RGB")
    draw = ImageDraw.Draw(image)
    font = _font(max(10, round(11 * device_scale_factor)))
    stroke = max(1, round(2 * device_scale_factor))
    pad = max(1, round(2 * device_scale_factor))
    width, height = image.size
    for element in elements:
        if element.box is None:
            continue
        left, top, right, bottom = _scaled(element.box, device_scale_factor)
        if right <= 0 or bottom <= 0 or left >= width or top >= height:
            continue
        color = _PALETTE[element.number % len(_PALETTE)]
        draw.rectangle((left, top, right - 1, bottom - 1), outline=color, width=stroke)
        label = str(element.number)
        text_left, text_top, text_right, text_bottom = draw.textbbox((0, 0), label, font=font)
        label_w = text_right - text_left + 2 * pad
        label_h = text_bottom - text_top + 2 * pad
        label_x = min(max(left, 0), width - label_w)
        label_y = top - label_h if top - label_h >= 0 else max(top, 0)
        draw.rectangle((label_x, label_y, label_x + label_w, label_y + label_h), fill=color)
        draw.text(
            (label_x + pad - text_left, label_y + pad - text_top),
            label,
            fill=(255, 255, 255),
            font=font,
        )
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def outline_target(
    screenshot: bytes,
    box: Box | Sequence[float],
    *,
    device_scale_factor: float = 1.0,
) -> bytes:
    """The screenshot with one thick outline around ``box`` (approval evidence); PNG."""
    image = Image.open(io.BytesIO(screenshot)).convert("RGB")
    draw = ImageDraw.Draw(image)
    stroke = max(3, round(4 * device_scale_factor))
    left, top, right, bottom = _scaled(box, device_scale_factor)
    # Drawn just outside the box so the control itself stays fully visible.
    draw.rectangle(
        (left - stroke, top - stroke, right + stroke - 1, bottom + stroke - 1),
        outline=(230, 25, 75),
        width=stroke,
    )
    return _png(image)


def thumbnail(image_bytes: bytes, *, width: int = 320) -> bytes:
    """A JPEG (quality 70) ``width`` pixels wide, keeping the aspect ratio, for the timeline."""
    image: Image.Image = Image.open(io.BytesIO(image_bytes))
    # A JPEG is decoded straight at (about) the small size: far less work than decode-then-shrink.
    image.draft("RGB", (width, max(1, image.height * width // image.width)))
    if image.mode in ("RGBA", "LA", "P"):
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        image = background
    else:
        image = image.convert("RGB")
    height = max(1, round(image.height * width / image.width))
    small = image.resize((width, height), Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    small.save(buffer, format="JPEG", quality=70, optimize=True)
    return buffer.getvalue()
