"""What the robot saw: a compact, numbered list of a page's controls, and pictures of them.

No Django imports. The runner takes a page's state with ``take`` (cheap, at the instant a step
ends) and the run's writer builds the numbered ``Observation`` from it later, off the runner's path.

Taking is one ``Runtime.evaluate`` of an in-page serialiser (``observation.js``) in the isolated
world that also holds the page's change counter (``PageWatch``): it walks the DOM, open shadow roots
and same-origin iframes in document order and returns, as one JSON string, a tree of the elements a
person reads or acts on, with roles and names computed the way accessibility tools do, their states,
values and boxes, the texts between them, and the values of password inputs. The page's own scripts
cannot see that world. What it leaves out is said: the content of a cross-origin iframe is not
walked, and the observation has a line saying so.

We keep what a person could interact with, plus headings, landmarks, alerts/status messages and
the text of table rows / list items that hold controls (so that twenty "Pay" buttons can be told
apart), and drop the rest. Every interactive element's ``ref`` is a Playwright selector that
addresses it (``page.locator(ref)``): ``nth-child`` steps from its document, through shadow hosts
and into iframes, valid for the page as it was taken.

Boxes are CSS pixels relative to the top-left corner of the viewport, i.e. what
``page.screenshot()`` (without ``full_page``) captures, clipped to the iframe that shows them;
multiply by the device scale factor to get screenshot pixels (``overlay`` does that).

Secrets: the value of a password input is a secret. Every such value and every caller-supplied
secret is redacted from names, values, the URL and the title before anything is rendered, so
neither ``text`` nor ``to_dict()`` can carry one, and every field showing one is masked in the
screenshot. Password inputs are found by code in the page, which a hostile page can fool;
``secret_values`` (what the runner typed) is the defence that holds.

``parse_snapshot`` reads Playwright's own AI snapshot (``page.aria_snapshot(mode="ai")``), against
which tests and benchmarks check that every control it lists is addressed here too.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
import re
import threading
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from PIL import Image, ImageDraw, ImageFont
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Locator, Page

from sessions.engine.screencast import mask_frame

MASK = "••••"
NAME_LIMIT = 80
VALUE_LIMIT = 80
CONTEXT_LIMIT = 100
MESSAGE_LIMIT = 160
# An open modal's own words (the amount, the payee it asks about): longer than a message.
DIALOG_TEXT_LIMIT = 500
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
# Modals whose text is kept, not only their controls: what they ask is in the text.
DIALOG_ROLES = frozenset({"dialog", "alertdialog"})
# Containers whose leftover text tells otherwise identical controls apart.
GROUP_ROLES = frozenset({"row", "listitem", "article"})


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
        if self.role == "text":
            return f"text: {self.name}"
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


def interactive_controls(snapshot: str) -> list[tuple[str, str]]:
    """Role and name, as an observation shows them, of every element a person could act on in
    one of Playwright's AI snapshots, in document order (the options of a native ``<select>``
    travel with it and are not listed)."""
    builder = _Builder(_Redactor(()))
    return [
        (control.role, control.name)
        for root in parse_snapshot(snapshot)
        for control in (builder._control(node, (), ()) for node in root.walk() if node.interactive)
    ]


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
            if role == "iframe" and node.props.get("opaque"):
                self.items.append(
                    _Pending(
                        ref=None,
                        role="text",
                        name="(a cross-origin frame: its content is not observed)",
                        frame=inner_frame,
                        landmarks=inner,
                    )
                )
            if role in DIALOG_ROLES:
                text = " · ".join(_context_texts(node, {node.name}))
                if text:
                    self.items.append(
                        _Pending(
                            ref=None,
                            role="text",
                            name=_clip(self.redact.text(text), DIALOG_TEXT_LIMIT),
                            frame=inner_frame,
                            landmarks=inner,
                        )
                    )
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


@dataclass(frozen=True)
class Capture:
    """An observation plus what the runner needs to picture the same moment.

    ``masks`` are the inputs to hide in a screenshot taken right after.
    """

    observation: Observation
    masks: list[Locator]


def observe(
    page: Page, *, secret_values: Collection[str] = (), max_elements: int | None = None
) -> Observation:
    """Observe ``page``: its controls, headings, landmarks and messages, numbered 1..N.

    Complete by default: stored evidence must address every element. With ``max_elements``
    (for what a model reads), elements past it in document order are left out, counted in
    ``omitted`` and said so on the last line. Read-only: nothing on the page is clicked, typed or
    scrolled.
    """
    return capture(page, secret_values=secret_values, max_elements=max_elements).observation


def capture(
    page: Page, *, secret_values: Collection[str] = (), max_elements: int | None = None
) -> Capture:
    """``observe`` plus the screenshot masks, built now."""
    taken = take(page, secret_values=secret_values, max_elements=max_elements)
    return Capture(observation=taken.build(), masks=taken.masks)


@dataclass(eq=False)
class Snapshot:
    """What a page showed at one instant, taken cheaply, to be built into an ``Observation``
    later and elsewhere (the run's writer thread) with ``build()``, which needs no page.

    Everything that depends on the instant is read here: the serialised page (``raw``, JSON with
    the URL and title), the password values (for redaction) and ``masks``, the inputs to paint
    over in a screenshot taken right after.
    """

    url: str
    title: str
    raw: str
    secrets: frozenset[str]
    masks: list[Locator]
    # The serialiser's selectors of the main frame's fields among ``masks``.
    mask_paths: tuple[str, ...] = ()
    max_elements: int | None = None
    _built: Observation | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def shown_title(self) -> str:
        return _Redactor(self.secrets).text(self.title)

    @property
    def key(self) -> str:
        """Equal for two snapshots of the same URL, controls, texts and layout."""
        return self.raw

    def build(self) -> Observation:
        """The numbered observation (built once; later calls return the same one)."""
        with self._lock:
            if self._built is None:
                self._built = _build(self)
            return self._built


def take(
    page: Page,
    *,
    secret_values: Collection[str] = (),
    max_elements: int | None = None,
    watch: PageWatch | None = None,
) -> Snapshot:
    """Read what must be read at this instant; leave the numbering and rendering for later.

    Costs one ``Runtime.evaluate`` in ``watch``'s isolated world (a ``PageWatch`` of ``page``;
    without one, a world is made for this call: two round trips more). Every field whose value
    or name holds a secret is masked, and every password input of every frame, cross-origin ones
    included.
    """
    if watch is None or watch.page is not page:
        with contextlib.closing(PageWatch(page)) as once:
            return _take(page, once, secret_values, max_elements)
    return _take(page, watch, secret_values, max_elements)


def _take(
    page: Page, watch: PageWatch, secret_values: Collection[str], max_elements: int | None
) -> Snapshot:
    raw = watch.evaluate(_SERIALISE)
    taken = json.loads(raw)
    if taken["url"] != page.url:
        # A world left from the document before (kept in the back/forward cache, say).
        raw = watch.evaluate(_SERIALISE, fresh=True)
        taken = json.loads(raw)
    passwords = taken["passwords"]
    every_secret = frozenset(
        {*(secret for secret in secret_values if secret), *(value for _, value in passwords)}
    )
    # Only what must be hidden: a mask makes the screenshot change the page (Playwright draws
    # it in), which the change counter then sees.
    selectors = _Selectors(taken["steps"])
    mask_paths = [selectors[ref] for ref, _ in passwords]
    opaque_masks = []
    if taken["opaque_frames"]:
        # A cross-origin frame's inputs are out of the serialiser's reach: mask them unseen.
        opaque_masks = [
            frame.locator("input[type=password], input[autocomplete=one-time-code]")
            for frame in page.frames[1:]
        ]
    if every_secret:
        redactor = _Redactor(every_secret)
        mask_paths += [selectors[ref] for ref in _refs_touching(taken["nodes"], redactor)]
    masks = [page.locator(path) for path in mask_paths] + opaque_masks
    return Snapshot(
        url=str(taken["url"]),
        title=str(taken["title"]),
        raw=raw,
        secrets=every_secret,
        masks=masks,
        mask_paths=tuple(mask_paths),
        max_elements=max_elements,
    )


class _Selectors:
    """The serialiser's table of steps, read as Playwright selectors (each built once)."""

    def __init__(self, steps: list[list[Any]]) -> None:
        self.steps = steps
        self.built: dict[int, str] = {}

    def __getitem__(self, row: int) -> str:
        selector = self.built.get(row)
        if selector is None:
            parent, step = self.steps[row]
            selector = self.built[row] = step if parent < 0 else self[parent] + step
        return selector


def _refs_touching(nodes: list[Any], redactor: _Redactor) -> Iterator[int]:
    """Refs of serialised nodes whose name or value holds a secret: the builder masks those
    values, and the screenshot must not show them either."""
    for node in nodes:
        if isinstance(node, str):
            continue
        _, name, attrs, text, _, children = node
        ref = attrs.get("ref")
        if ref is not None and (
            redactor.touches(name) or (text is not None and redactor.touches(text))
        ):
            yield ref
        yield from _refs_touching(children, redactor)


def _tree(nodes: list[Any], selectors: _Selectors) -> list[SnapshotNode]:
    """The serialiser's nested lists as snapshot nodes (a text is a node of role ``text``)."""
    tree: list[SnapshotNode] = []
    for node in nodes:
        if isinstance(node, str):
            tree.append(SnapshotNode(role="text", text=node))
            continue
        role, name, attrs, text, props, children = node
        if "ref" in attrs:
            attrs["ref"] = selectors[attrs["ref"]]
        tree.append(
            SnapshotNode(
                role=role,
                name=name,
                attrs=attrs,
                text=text,
                props=props,
                children=_tree(children, selectors),
            )
        )
    return tree


def _build(taken: Snapshot) -> Observation:
    redactor = _Redactor(taken.secrets)
    builder = _Builder(redactor)
    serialised = json.loads(taken.raw)
    for root in _tree(serialised["nodes"], _Selectors(serialised["steps"])):
        builder.visit(root)
    items = builder.items

    # Landmarks (and iframes) earn a line only when something kept lies inside them.
    used: set[int] = set()
    for item in items:
        if not _is_landmark(item):
            used.update(id(landmark) for landmark in item.landmarks)
    kept = [item for item in items if not _is_landmark(item) or id(item) in used]

    max_elements = taken.max_elements
    omitted = 0 if max_elements is None else max(0, len(kept) - max_elements)
    if max_elements is not None:
        kept = kept[:max_elements]
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
            box=item.box if item.interactive else None,
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
    return Observation(
        url=redactor.text(taken.url),
        title=redactor.text(taken.title),
        elements=elements,
        text="\n".join(lines),
        omitted=omitted,
    )


# The serialiser ``take`` runs in the page's isolated world. It returns one JSON string:
# ``{url, title, passwords: [[ref, value], …], opaque_frames, steps, nodes}`` where a node is
# ``[role, name, attrs, text, props, children]`` (attrs as Playwright's snapshot writes them: ref,
# box, level, checked, cursor=pointer, …; props: url, placeholder, opaque) or a string of text,
# and a ref is a row of ``steps``, ``[row of the parent or -1, step]``, joined into a selector
# by ``_Selectors``.
# Elements without a role the observation keeps are flattened into their parent; a block boundary
# keeps the texts on either side apart.
_SERIALISE = (Path(__file__).parent / "observation.js").read_text()


# --- has the page changed? -----------------------------------------------------------------------

# Installed in an isolated world of the main frame: it shares the page's DOM, so the observer
# sees every mutation, but the page's own scripts cannot see or reset the counter.
_WATCH_INSTALL = """(() => {
  if (globalThis.__pandawebChanges !== undefined) return;
  globalThis.__pandawebChanges = 0;
  const bump = () => { globalThis.__pandawebChanges += 1; };
  new MutationObserver(bump).observe(document, {
    subtree: true, childList: true, attributes: true, characterData: true,
  });
  // What changes no DOM node: typed values, focus, scrolling of inner boxes, <details>.
  for (const type of ["input", "change", "focusin", "focusout", "scroll", "toggle"]) {
    document.addEventListener(type, bump, true);
  }
})()"""
_WATCH_READ = (
    "JSON.stringify([globalThis.__pandawebChanges, location.href, document.readyState,"
    " scrollX, scrollY, innerWidth, innerHeight, devicePixelRatio])"
)


class PageWatch:
    """Tells cheaply (one CDP round trip) whether a page may have changed since a mark.

    ``mark()`` returns a token; equal tokens from one ``PageWatch`` mean the same document with
    no DOM mutation, input, focus change or scroll in between, at the same URL, scroll position
    and viewport. ``None`` means "cannot tell" (a page with iframes, whose mutations the main
    frame's observer does not see; a CDP error): treat it as changed. Not seen: CSS animations,
    ``:hover`` and canvas drawing, which change pixels but no element a step acts on.
    """

    def __init__(self, page: Page) -> None:
        self.page = page
        self._session: Any = None
        self._context: int | None = None
        self._frame: str | None = None

    def mark(self) -> str | None:
        if len(self.page.frames) > 1:
            return None
        try:
            state = self.evaluate(_WATCH_READ)
        except PlaywrightError:
            return None
        return state if isinstance(state, str) else None

    def evaluate(self, expression: str, *, fresh: bool = False) -> Any:
        """The value of ``expression`` in this page's isolated world, made (with a fresh change
        counter) on the first call for each document, or when ``fresh``."""
        if self._session is None:
            self._session = self.page.context.new_cdp_session(self.page)
        if self._context is not None and not fresh:
            try:
                return self._evaluate(expression)
            except PlaywrightError:
                pass  # the document this world belonged to is gone
        # The main frame keeps its id across navigations, so it is asked for once.
        try:
            if self._frame is None:
                self._frame = self._session.send("Page.getFrameTree")["frameTree"]["frame"]["id"]
            world = self._session.send(
                "Page.createIsolatedWorld",
                {
                    "frameId": self._frame,
                    "worldName": "pandaweb-watch",
                    "grantUniveralAccess": False,
                },
            )
        except PlaywrightError:
            self._context = self._frame = None
            raise
        self._context = int(world["executionContextId"])
        return self._evaluate(_WATCH_INSTALL + ";" + expression)

    def screenshot(self, *, quality: int) -> bytes:
        """A JPEG of the viewport as it shows now, in one CDP round trip.

        Playwright's ``page.screenshot`` spends three or four more (fonts, layout metrics, its
        own set-up) on every call: a fifth to a third of each step's picture. This one cannot
        mask: a picture with something to hide goes through Playwright's."""
        if self._session is None:
            self._session = self.page.context.new_cdp_session(self.page)
        answer = self._session.send(
            "Page.captureScreenshot", {"format": "jpeg", "quality": quality}
        )
        return base64.b64decode(answer["data"])

    def masked_screenshot(self, mask_paths: Sequence[str], *, quality: int) -> bytes | None:
        """A JPEG of the viewport with the fields at ``mask_paths`` (``Snapshot.mask_paths``)
        painted over, or None when their place cannot be known exactly: the page has frames
        (whose inputs another origin may hold), or a field is gone or moved while the picture
        was taken.

        The boxes are read in this watch's isolated world, where the page's scripts cannot
        change what ``getBoundingClientRect`` says, before and after one
        ``Page.captureScreenshot``. Playwright's masked ``page.screenshot`` draws overlays
        into the page and removes them again (a third of a second on a login page), and
        the overlays are changes the change counter sees."""
        if len(self.page.frames) > 1:
            return None
        read = f"({_BOXES})({json.dumps(list(mask_paths))})"
        before = self.evaluate(read)
        if before is None:
            return None
        jpeg = self.screenshot(quality=quality)
        if self.evaluate(read) != before:
            return None
        css_width, boxes = before
        return mask_frame(jpeg, boxes, {"deviceWidth": css_width}, quality=quality).jpeg

    def close(self) -> None:
        """Let go of the CDP session (the page and its world stay as they are)."""
        session, self._session, self._context = self._session, None, None
        if session is not None:
            with contextlib.suppress(PlaywrightError):
                session.detach()

    def _evaluate(self, expression: str) -> Any:
        answer = self._session.send(
            "Runtime.evaluate",
            {"expression": expression, "contextId": self._context, "returnByValue": True},
        )
        if "exceptionDetails" in answer:
            details = answer["exceptionDetails"]
            raise PlaywrightError(
                details.get("exception", {}).get("description") or details.get("text", "")
            )
        return answer.get("result", {}).get("value")


# The boxes of the elements at the serialiser's selectors (``html>body>div:nth-child(2)>…``, a
# step below a shadow host being one of its shadow root's children); null when one matches
# nothing. Every element a path may mean is boxed: masking too much is safe.
_BOXES = r"""paths => {
  const childrenOf = node => node === document ? [document.documentElement] :
    [...node.children, ...(node.shadowRoot ? node.shadowRoot.children : [])];
  const position = e => {
    let k = 1;
    for (let c = e.previousElementSibling; c; c = c.previousElementSibling) k += 1;
    return k;
  };
  const boxes = [];
  for (const path of paths) {
    let found = [document];
    for (const step of path.split(">")) {
      const [, name, nth] = /^([^:]+)(?::nth-child\((\d+)\))?$/.exec(step) || [];
      if (!name) return null;
      found = found.flatMap(childrenOf).filter(
        e => e.localName === name && (!nth || position(e) === Number(nth)));
    }
    if (!found.length) return null;
    for (const e of found) {
      const r = e.getBoundingClientRect();
      boxes.push([r.x, r.y, r.width, r.height]);
    }
  }
  return [innerWidth, boxes];
}"""


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
