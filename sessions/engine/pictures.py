"""Pictures drawn from a step's screenshot with Pillow: the numbered overlay, the outline
around an approval's target, and the timeline's thumbnail.

No Django imports, no browser: the run's writer draws them off the runner's path, and the
approval's evidence is drawn from its gate's screenshot.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING

from PIL import Image, ImageDraw, ImageFont

from sessions.engine.reading import Box

# For the type only: observation loads Playwright, which drawing needs not.
if TYPE_CHECKING:
    from sessions.engine.observation import Element

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


def picture_size(image_bytes: bytes) -> tuple[int, int]:
    """Width and height of a picture in pixels (read from its header)."""
    with Image.open(io.BytesIO(image_bytes)) as image:
        return image.size


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
