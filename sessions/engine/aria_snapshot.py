"""A page's accessibility tree as nodes (``SnapshotNode``), and Playwright's aria snapshot text
parsed into them.

No Django imports, no browser: the observation's serialiser (``sessions.engine.observation``)
returns its tree as these nodes, and ``parse_snapshot`` reads Playwright's own AI snapshot
(``page.aria_snapshot(mode="ai")``), against which tests and benchmarks check that every control
it lists is addressed by an observation too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

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
