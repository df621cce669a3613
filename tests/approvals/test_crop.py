"""The close-up a reviewer sees first: the target with the dialog or form it sits in, never its
words cut off at one side."""

from __future__ import annotations

import io

from PIL import Image, ImageDraw

from approvals.crop import MAX_CONTEXT_HEIGHT, crop_around


def picture(width: int = 1280, height: int = 800) -> bytes:
    image = Image.new("RGB", (width, height), "white")
    ImageDraw.Draw(image).rectangle((100, 300, 1100, 560), outline="black")
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def size_of(png: bytes) -> tuple[int, int]:
    return Image.open(io.BytesIO(png)).size


BUTTON = {"x": 960, "y": 500, "width": 120, "height": 36}
DIALOG = {"x": 100, "y": 300, "width": 1000, "height": 260}


def test_a_button_alone_gets_a_margin_around_it() -> None:
    assert size_of(crop_around(picture(), BUTTON)) == (480, 240)


def test_a_button_in_a_dialog_keeps_the_whole_dialog() -> None:
    cropped = Image.open(io.BytesIO(crop_around(picture(), BUTTON, DIALOG)))
    # The dialog spans 1000 px from x=100: the close-up holds it all, with its margin where the
    # picture has room (the dialog's left edge, dark, is inside).
    assert cropped.size == (1280, 460)
    assert any(cropped.getpixel((x, 160)) == (0, 0, 0) for x in range(0, 200))


def test_a_dialog_taller_than_a_screen_keeps_its_width_only() -> None:
    tall = {"x": 100, "y": 0, "width": 1000, "height": MAX_CONTEXT_HEIGHT + 100}
    assert size_of(crop_around(picture(), BUTTON, tall)) == (1280, 240)
