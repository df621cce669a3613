"""Reading a page's tree: which nodes an observation keeps, and what it says of each.

No Django imports, no browser. We keep what a person could interact with, plus headings,
landmarks, alerts/status messages and the text of table rows / list items that hold controls (so
that twenty "Pay" buttons can be told apart), and drop the rest. Names, values and texts are
clipped, and every secret (the values of password inputs, what the runner typed) is redacted
before anything is kept: a value that holds one is masked whole.

Boxes are CSS pixels relative to the top-left corner of the viewport, i.e. what
``page.screenshot()`` (without ``full_page``) captures, clipped to the iframe that shows them;
multiply by the device scale factor to get screenshot pixels (``pictures.overlay`` does that).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from sessions.engine.aria_snapshot import SnapshotNode, parse_snapshot
from sessions.engine.vocabulary import MASK

NAME_LIMIT = 80
VALUE_LIMIT = 80
CONTEXT_LIMIT = 100
MESSAGE_LIMIT = 160
# An open modal's own words (the amount, the payee it asks about): longer than a message.
DIALOG_TEXT_LIMIT = 500
OPTIONS_SHOWN = 12

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


class Redactor:
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
class Pending:
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
    landmarks: tuple[Pending, ...] = ()


class Builder:
    def __init__(self, redactor: Redactor) -> None:
        self.redact = redactor
        self.items: list[Pending] = []
        self.seen_messages: set[tuple[str, str]] = set()

    def visit(
        self,
        node: SnapshotNode,
        *,
        frame: tuple[str, ...] = (),
        landmarks: tuple[Pending, ...] = (),
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
            landmark = Pending(
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
                    Pending(
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
                        Pending(
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
                    Pending(
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
                    Pending(ref=node.ref, role=role, name=message, frame=frame, landmarks=landmarks)
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
        self, node: SnapshotNode, *, frame: tuple[str, ...], landmarks: tuple[Pending, ...]
    ) -> None:
        start = len(self.items)
        marker = Pending(ref=node.ref, role=node.role, name="", frame=frame, landmarks=landmarks)
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
        self, node: SnapshotNode, *, frame: tuple[str, ...], landmarks: tuple[Pending, ...]
    ) -> None:
        if node.interactive:
            self.items.append(self._control(node, frame, landmarks))
        for child in node.children:
            self._visit_refs_only(child, frame=frame, landmarks=landmarks)

    def _control(
        self, node: SnapshotNode, frame: tuple[str, ...], landmarks: tuple[Pending, ...]
    ) -> Pending:
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
        state = tuple(_states(node))
        return Pending(
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


def is_landmark(item: Pending) -> bool:
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


def interactive_controls(snapshot: str) -> list[tuple[str, str]]:
    """Role and name, as an observation shows them, of every element a person could act on in
    one of Playwright's AI snapshots, in document order (the options of a native ``<select>``
    travel with it and are not listed)."""
    builder = Builder(Redactor(()))
    return [
        (control.role, control.name)
        for root in parse_snapshot(snapshot)
        for control in (builder._control(node, (), ()) for node in root.walk() if node.interactive)
    ]
