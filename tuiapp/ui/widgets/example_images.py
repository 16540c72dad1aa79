"""The data preview's image chats: each example's images (textual-image) beside its turns and mask.

textual-image draws with Kitty's graphics protocol or Sixel where the terminal speaks one, with
coloured half-blocks otherwise (any terminal, any SSH session). It asks the terminal what it can do
when first imported, which must happen before Textual takes the terminal over: this module is
imported before the app starts (tuiapp.ui.app.run_app). LLMTUI_IMAGES=halfcell forces half-blocks
(the snapshot tests do, so the pictures are the same on every machine). Where textual-image cannot
start (a terminal that reports no size fails its probe), pictures are drawn as half-blocks here.
"""

from __future__ import annotations

import os

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from tuiapp.ui.preview import example_heading, example_text, image_caption

try:
    from textual_image.widget import HalfcellImage
    from textual_image.widget import Image as AutoImage
except Exception:  # noqa: BLE001 - its terminal probe failed (e.g. a pty of 0 columns): our half-blocks
    HalfcellImage = AutoImage = None

RENDERER_ENV = "LLMTUI_IMAGES"  # auto (the terminal's best) | halfcell


class HalfBlockPicture(Static):
    """A picture as '▀' cells, the upper pixel the foreground and the lower one the background
    (where textual-image could not start)."""

    def __init__(self, path: str, classes: str = "") -> None:
        super().__init__(half_block_text(path), classes=classes)
        self.image = path


def half_block_text(path: str, width: int = 16) -> Text:
    from PIL import Image

    with Image.open(path) as image:
        rgb = image.convert("RGB")
    height = max(2, round(rgb.height * width / rgb.width / 2) * 2)
    pixels = rgb.resize((width, height)).load()
    out = Text()
    for y in range(0, height, 2):
        for x in range(width):
            upper, lower = pixels[x, y], pixels[x, y + 1]
            out.append("▀", Style(color=f"rgb{upper}", bgcolor=f"rgb{lower}"))
        if y + 2 < height:
            out.append("\n")
    return out


def image_class():
    """The image widget class: the terminal's best, or half-blocks when LLMTUI_IMAGES=halfcell (or
    textual-image could not start)."""
    if AutoImage is None:
        return HalfBlockPicture
    return HalfcellImage if os.environ.get(RENDERER_ENV, "auto").strip().lower() == "halfcell" else AutoImage


class ImageExample(Vertical):
    """One example: its heading, then its images (each with its name and size) beside its sequence."""

    DEFAULT_CSS = """
    ImageExample { height: auto; }
    ImageExample .ie-heading { text-style: bold; margin-top: 1; }
    ImageExample .ie-row { height: auto; }
    ImageExample .ie-images { width: 18; height: auto; }
    ImageExample .ie-picture { width: 16; height: 8; }
    ImageExample .ie-caption { width: 18; color: $text-muted; }
    ImageExample .ie-text { width: 1fr; height: auto; }
    """

    def __init__(self, kind: str, index: int, example: dict) -> None:
        super().__init__()
        self.kind = kind
        self.index = index
        self.example = example

    def compose(self) -> ComposeResult:
        yield Static(example_heading(self.kind, self.index, self.example), classes="ie-heading", markup=False)
        with Horizontal(classes="ie-row"):
            with Vertical(classes="ie-images"):
                picture = image_class()
                for image in self.example.get("images") or []:
                    yield picture(image["path"], classes="ie-picture")
                    yield Static(image_caption(image), classes="ie-caption", markup=False)
            yield Static(example_text(self.example), classes="ie-text", markup=False)


class ExampleImages(Vertical):
    """The examples with images, under the trainer view's text (which leaves them out)."""

    DEFAULT_CSS = "ExampleImages { height: auto; }"

    def show(self, kind: str, examples: list[dict] | None) -> None:
        self.remove_children()
        shown = [ImageExample(kind, index, example) for index, example in enumerate(examples or [], start=1)
                 if example.get("images")]
        if shown:
            self.mount_all(shown)
