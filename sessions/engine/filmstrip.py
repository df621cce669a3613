"""A run's filmstrip: masked live-view frames kept at a low rate with the run's files, each with
its time and hash in ``filmstrip/index.jsonl`` (no Django imports)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

FOLDER = "filmstrip"
INDEX = "index.jsonl"


def filmstrip_append(files_dir: Path, *, number: int, jpeg: bytes, at: float, masks: int) -> None:
    """Keep one more frame (``at``: seconds since the epoch) and its line in the index."""
    folder = files_dir / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    name = f"frame-{number:05d}.jpg"
    (folder / name).write_bytes(jpeg)
    line = {
        "file": name,
        "at": datetime.fromtimestamp(at, UTC).isoformat(),
        "sha256": hashlib.sha256(jpeg).hexdigest(),
        "masks": masks,
    }
    with (folder / INDEX).open("a") as index:
        index.write(json.dumps(line) + "\n")


def filmstrip_frames(files_dir: Path) -> list[dict[str, Any]]:
    """The filmstrip's frames in order (empty when the run kept none)."""
    index = files_dir / FOLDER / INDEX
    if not index.is_file():
        return []
    return [json.loads(line) for line in index.read_text().splitlines() if line.strip()]
