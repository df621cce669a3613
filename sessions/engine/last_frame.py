"""The last masked live-view frame of a run's browser, kept with the run's files when the worker
lets go of the browser: what the run page shows while the run waits for a person or after it
ends (no Django imports)."""

from __future__ import annotations

import os
from pathlib import Path

LAST_FRAME = "live/last-frame.jpg"


def last_frame_keep(files_dir: Path, jpeg: bytes, *, at: float) -> None:
    """Keep ``jpeg``, captured at ``at`` (seconds since the epoch), as the run's last frame.
    The file's modification time is ``at``: a page compares it with its steps' pictures. A
    page reading the file meanwhile gets the old frame or the new one whole, never half."""
    target = files_dir / LAST_FRAME
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".part")
    partial.write_bytes(jpeg)
    os.utime(partial, (at, at))
    os.replace(partial, target)


def last_frame_forget(files_dir: Path) -> None:
    """Forget the frame of an earlier stretch: the steps since have newer pictures."""
    (files_dir / LAST_FRAME).unlink(missing_ok=True)


def last_frame_at(files_dir: Path) -> float | None:
    """When the kept frame was captured (seconds since the epoch), or None if none is kept."""
    try:
        return (files_dir / LAST_FRAME).stat().st_mtime
    except FileNotFoundError:
        return None
