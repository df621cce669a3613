"""The close-up of the element an approval acts on, cut from its outlined picture (no Django).

Phones show it first: the whole page shrunk to 360 px makes a button unreadable. Where the
element sits in a dialog or a form, the close-up keeps all of it in, so the words around the
button (the payee, the amount) are never cut off at one side.
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
# A dialog or form taller than this is most of the page: the close-up then keeps its width only.
MAX_CONTEXT_HEIGHT = 640
Box = Mapping[str, float]


def crop_around(picture: bytes, box: Box, context: Box | None = None) -> bytes:
    """``picture`` cut around ``box`` and the ``context`` it sits in (CSS pixels of a scale-1
    screenshot) with a margin, kept inside the picture; PNG."""
    image = Image.open(io.BytesIO(picture)).convert("RGB")
    width, height = image.size
    left, top = float(box["x"]), float(box["y"])
    right, bottom = left + float(box["width"]), top + float(box["height"])
    if context and context.get("width") and context.get("height"):
        context_left, context_top = float(context["x"]), float(context["y"])
        left, right = min(left, context_left), max(right, context_left + float(context["width"]))
        if float(context["height"]) <= MAX_CONTEXT_HEIGHT:
            top = min(top, context_top)
            bottom = max(bottom, context_top + float(context["height"]))
    crop_w = min(width, max(MIN_WIDTH, right - left + 2 * MARGIN_X))
    crop_h = min(height, max(MIN_HEIGHT, bottom - top + 2 * MARGIN_Y))
    crop_left = min(max(0.0, (left + right) / 2 - crop_w / 2), width - crop_w)
    crop_top = min(max(0.0, (top + bottom) / 2 - crop_h / 2), height - crop_h)
    region = image.crop(
        (round(crop_left), round(crop_top), round(crop_left + crop_w), round(crop_top + crop_h))
    )
    out = io.BytesIO()
    region.save(out, format="PNG", optimize=True)
    return out.getvalue()
