"""The writer's half of recording a step: build what the runner only took.

No Django imports. The runner takes, on its own path, only what must be read at the instant a
step ends (``observation.take``: the serialised page, the masks, the masked picture) and hands the
record to its sink; the sink's writer thread calls ``finish`` before persisting it, so the
numbered observation, the overlay and the thumbnail cost the browser nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sessions.engine.pictures import overlay, thumbnail


@dataclass(frozen=True)
class Pictures:
    """What is drawn from a step's screenshot: the numbered overlay and the timeline thumbnail."""

    overlay: bytes | None
    thumbnail: bytes | None


def finish(record: Any) -> Pictures:
    """Complete ``record`` (a ``runner.StepRecord``) in place and draw its pictures.

    Builds the observation from ``record.pending`` (once: a step that found the page unchanged
    shares the last step's snapshot, and its build). Keys the runner already put into
    ``record.observation`` (the dialogs a step answered) are kept.
    """
    taken = record.pending
    if taken is not None:
        built = taken.build()
        record.observation = {**built.to_dict(), **(record.observation or {})}
        record.observation_chars = built.size_chars
        record.observation_tokens = built.token_estimate
        record.elements = built.elements
        record.pending = None
    if not record.screenshot:
        return Pictures(overlay=None, thumbnail=None)
    return Pictures(
        overlay=overlay(record.screenshot, record.elements),
        thumbnail=thumbnail(record.screenshot),
    )
