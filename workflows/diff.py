"""A readable difference between two workflow documents (no Django imports).

Steps and parameters are matched by id / name, so a changed step shows as changed, not as one
removed and one added; changes are listed field by field with dotted paths (target.name).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any, Literal


@dataclass(frozen=True)
class FieldChange:
    path: str
    old: Any
    new: Any


@dataclass(frozen=True)
class DiffEntry:
    section: Literal["workflow", "settings", "session", "parameters", "steps"]
    kind: Literal["added", "removed", "changed", "moved"]
    label: str
    changes: list[FieldChange] = field(default_factory=list)
    note: str = ""


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        flat = {}
        for index, item in enumerate(value):
            flat.update(flatten(item, f"{prefix}[{index + 1}]"))
        return flat
    return {prefix: value}


def field_changes(old: Any, new: Any) -> list[FieldChange]:
    a, b = flatten(old), flatten(new)
    return [
        FieldChange(path=path, old=a.get(path), new=b.get(path))
        for path in sorted(a.keys() | b.keys())
        if a.get(path) != b.get(path)
    ]


def document_diff(old: dict[str, Any], new: dict[str, Any]) -> list[DiffEntry]:
    entries: list[DiffEntry] = []
    identity = ("name", "slug", "description", "reviewer_group")
    changes = field_changes({k: old.get(k) for k in identity}, {k: new.get(k) for k in identity})
    if changes:
        entries.append(DiffEntry("workflow", "changed", "Workflow", changes))
    changes = field_changes(old.get("settings", {}), new.get("settings", {}))
    if changes:
        entries.append(DiffEntry("settings", "changed", "Settings", changes))
    changes = field_changes(old.get("session") or {}, new.get("session") or {})
    if changes:
        entries.append(DiffEntry("session", "changed", "Session template", changes))
    entries += _keyed("parameters", old.get("parameters", []), new.get("parameters", []), "name")
    entries += _keyed("steps", old.get("steps", []), new.get("steps", []), "id")
    return entries


def _keyed(
    section: Literal["parameters", "steps"],
    old: list[dict[str, Any]],
    new: list[dict[str, Any]],
    key: str,
) -> list[DiffEntry]:
    noun = "Step" if section == "steps" else "Parameter"
    old_by = {item.get(key): (i, item) for i, item in enumerate(old)}
    new_by = {item.get(key): (i, item) for i, item in enumerate(new)}
    moved = _moved(old, new, key) if section == "steps" else set()
    entries = []
    for name, (position, item) in new_by.items():
        label = f"{noun} '{name}'"
        if name not in old_by:
            entries.append(
                DiffEntry(
                    section,
                    "added",
                    label,
                    field_changes({}, item),
                    note=f"at position {position + 1}",
                )
            )
            continue
        old_position, old_item = old_by[name]
        changes = field_changes(old_item, item)
        if changes:
            entries.append(DiffEntry(section, "changed", label, changes))
        if name in moved:
            entries.append(
                DiffEntry(
                    section,
                    "moved",
                    label,
                    note=f"from position {old_position + 1} to {position + 1}",
                )
            )
    for name, (position, item) in old_by.items():
        if name not in new_by:
            entries.append(
                DiffEntry(
                    section,
                    "removed",
                    f"{noun} '{name}'",
                    field_changes(item, {}),
                    note=f"was at position {position + 1}",
                )
            )
    return entries


def _moved(old: list[dict[str, Any]], new: list[dict[str, Any]], key: str) -> set[Any]:
    """Items whose order relative to the others changed.

    The longest common ordering of the items both versions share stays put; the rest moved.
    Adding or removing other steps shifts positions without anything having moved.
    """
    shared = {i.get(key) for i in old} & {i.get(key) for i in new}
    old_order = [i.get(key) for i in old if i.get(key) in shared]
    new_order = [i.get(key) for i in new if i.get(key) in shared]
    matcher = SequenceMatcher(None, old_order, new_order, autojunk=False)
    kept = {
        old_order[block.a + offset]
        for block in matcher.get_matching_blocks()
        for offset in range(block.size)
    }
    return shared - kept
