"""The close-up of the element an approval acts on, cut from its outlined picture (no Django).

Phones show it first: the whole page shrunk to 360 px makes a button unreadable.
"""

from __future__ import annotations

import io
from collections.abc import Mapping

from PIL import Image

# Enough of the surroundings to recognise the place on the page (the form, the label).
MARGIN_X = 160
MARGIN_Y = 100
MIN_WIDTH = 480
MIN_HEIGHT = 240


def crop_around(picture: bytes, box: Mapping[str, float]) -> bytes:
    """``picture`` cut around ``box`` (CSS pixels of a scale-1 screenshot) with a margin,
    kept inside the picture; PNG."""
    image = Image.open(io.BytesIO(picture)).convert("RGB")
    width, height = image.size
    x, y = float(box["x"]), float(box["y"])
    w, h = float(box["width"]), float(box["height"])
    crop_w = min(width, max(MIN_WIDTH, w + 2 * MARGIN_X))
    crop_h = min(height, max(MIN_HEIGHT, h + 2 * MARGIN_Y))
    left = min(max(0.0, x + w / 2 - crop_w / 2), width - crop_w)
    top = min(max(0.0, y + h / 2 - crop_h / 2), height - crop_h)
    region = image.crop((round(left), round(top), round(left + crop_w), round(top + crop_h)))
    out = io.BytesIO()
    region.save(out, format="PNG", optimize=True)
    return out.getvalue()
