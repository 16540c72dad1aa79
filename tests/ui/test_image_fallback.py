"""Where textual-image cannot start (its terminal probe fails on a pty that reports no size), the data
preview draws pictures as half-blocks of its own: the upper pixel over the lower one."""

from __future__ import annotations

from PIL import Image
from textual_image.widget import HalfcellImage

from tuiapp.ui.widgets import example_images


def test_half_block_text_puts_the_upper_pixel_over_the_lower(tmp_path):
    path = tmp_path / "rows.png"
    image = Image.new("RGB", (4, 4), (255, 255, 255))
    image.paste((220, 30, 30), (0, 0, 4, 1))
    image.paste((30, 70, 220), (0, 1, 4, 2))
    image.save(path)
    text = example_images.half_block_text(str(path), width=4)
    assert text.plain == "▀▀▀▀\n▀▀▀▀"
    first = text.spans[0].style
    assert first.color.triplet == (220, 30, 30) and first.bgcolor.triplet == (30, 70, 220)
    last = text.spans[-1].style
    assert last.color.triplet == last.bgcolor.triplet == (255, 255, 255)


def test_the_picture_class_follows_llmtui_images_and_falls_back(monkeypatch):
    monkeypatch.setenv(example_images.RENDERER_ENV, "halfcell")
    assert example_images.image_class() is HalfcellImage
    monkeypatch.setattr(example_images, "AutoImage", None)  # as when textual-image failed to import
    assert example_images.image_class() is example_images.HalfBlockPicture
