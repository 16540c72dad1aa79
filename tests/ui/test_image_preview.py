"""The data preview of an image chat recipe (tiny-vlm-lora on demo:shapes): the form's Data tab shows
each example's image (textual-image, half-blocks forced so the frames are the same everywhere) beside
its turns and mask, as the trainer tokenizes them (the real `llmtui data --json` child process with
the real tiny VLM's processor)."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Static, TabbedContent
from textual_image.widget import HalfcellImage
from ui_fixtures import test_app, wait_for

from tuiapp.core.config.recipe import load_recipe
from tuiapp.ui.screens.new_experiment import NewExperimentScreen
from tuiapp.ui.widgets.example_images import RENDERER_ENV, ImageExample

pytestmark = pytest.mark.slow  # the preview tokenizes in a child process (torch import): ~10 s on 2 cores
ROOT = Path(__file__).resolve().parents[2]
# 80x24 only: there the Data tab fills the screen; wider, the form beside it changes with every recipe key
SIZES = [(80, 24)]


@pytest.fixture(autouse=True)
def half_blocks(monkeypatch):
    monkeypatch.setenv(RENDERER_ENV, "halfcell")


def _app(tmp_path):
    app = test_app(tmp_path / "runs", tmp_path, live=False)
    recipe = load_recipe(ROOT / "recipes" / "tiny-vlm-lora.toml")
    return app, recipe


async def _data_tab_with_images(pilot, recipe) -> NewExperimentScreen:
    app = pilot.app
    await wait_for(pilot, lambda: app.screen.loaded, what="home")
    app.open_form(recipe, title="tiny-vlm-lora")
    await wait_for(pilot, lambda: isinstance(app.screen, NewExperimentScreen) and app.screen.last_check is not None,
                   timeout=120, what="the form's first check")
    screen = app.screen
    if app.size.width < 120:
        await pilot.press("ctrl+t")
    screen.query_one("#ne-side", TabbedContent).active = "tab-data"
    await wait_for(pilot, lambda: len(screen.query(ImageExample)) == 2, timeout=120, what="the image examples")
    await wait_for(pilot, lambda: "records as read" in str(screen.query_one("#ne-data", Static).render()),
                   what="the records")
    await pilot.pause()
    return screen


@pytest.mark.parametrize("size", SIZES, ids=["80x24"])
def test_data_preview_shows_the_image_beside_the_turns_and_mask(snap_compare, tmp_path, size):
    app, recipe = _app(tmp_path)

    async def run_before(pilot):
        screen = await _data_tab_with_images(pilot, recipe)
        first = screen.query(ImageExample).first()
        pictures = list(first.query(HalfcellImage))
        assert len(pictures) == 1 and Path(str(pictures[0].image)).name == "train-0000.png"
        caption = str(first.query_one(".ie-caption", Static).render())
        assert caption == "train-0000.png 64x64 PNG"
        text = first.query_one(".ie-text", Static).render()
        assert "<image_soft_token>" in text.plain and "⟦<|im_start|>user" in text.plain  # image tokens: masked
        trained = [text.plain[s.start:s.end] for s in text.spans if "green" in str(s.style)]
        assert trained == ["two<|im_end|>"]  # only the answer trains
        # the frame is about the pictures: the form's verdict (its memory estimate) and the records as
        # read (whose length sets the scrollbar) change with other work, so they are left out of it
        screen.query_one("#ne-verdict").display = False
        screen.query_one("#ne-data").display = False
        await pilot.pause()
        first.scroll_visible(animate=False, top=True)
        await pilot.pause()
        screen.query_one("#f-name").cursor_blink = False

    assert snap_compare(app, terminal_size=size, run_before=run_before)
