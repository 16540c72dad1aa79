"""The TUI's chat with a vision-language model: `/image PATH` typed in the input attaches the image to
the next message, which the real inference server shows the tiny VLM trained on demo:shapes (the run
comes from tests/after_runs.py); a path that is not an image is refused before anything is sent."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from ui_fixtures import test_app, wait_for

from tests.after_runs import vlm_run
from tuiapp.core.data.demo_shapes import COLOURS, COUNT_WORDS, SHAPES, data_file
from tuiapp.ui.screens.chat import ChatColumn, ChatScreen

pytestmark = pytest.mark.slow
START_S = 180.0
WORDS = {*COUNT_WORDS, *SHAPES, *COLOURS, "left", "middle", "right"}


def _texts(column: ChatColumn, selector: str) -> list[str]:
    return [str(child.render()) for child in column.query(selector)]


def test_slash_image_attaches_an_image_to_the_next_message(tmp_path_factory, tmp_path):
    run = vlm_run(tmp_path_factory)
    root = tmp_path / "runs"
    shutil.copytree(run, root / run.name)
    heldout = data_file("demo:shapes-heldout")
    record = json.loads(heldout.read_text().splitlines()[3])
    image = str(heldout.parent / record["images"][0])
    question = record["messages"][0]["content"].replace("<image>", "")
    app = test_app(root, tmp_path, live=False)

    async def scenario():
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.screen.loaded, what="history")
            app.push_screen(ChatScreen(run.name))
            await pilot.pause()
            screen = app.screen
            await wait_for(pilot, lambda: screen.ready or screen.failed, timeout=START_S, what="the model server")
            assert screen.failed is None and screen.sees_images == {"tuned": True}
            field = screen.query_one("#chat-input")

            field.value = "/image nowhere.png"  # refused: nothing attached, nothing sent
            await pilot.press("enter")
            await pilot.pause()
            assert screen.attached == [] and not screen.busy

            field.value = f"/image {image}"
            await pilot.press("enter")
            await pilot.pause()
            assert screen.attached == [image] and not screen.busy
            tuned = screen.column("tuned")
            assert any("attached heldout-0003.png (64x64 PNG)" in t for t in _texts(tuned, ".chat-note"))

            field.value = question
            await pilot.press("enter")
            await wait_for(pilot, lambda: not screen.busy, timeout=60, what="the answer")
            assert screen.attached == []  # it went with that message
            assert _texts(tuned, ".chat-user")[-1] == f"you: [image heldout-0003.png] {question}"
            assert _texts(tuned, ".chat-answer")[-1] in WORDS
            assert screen.session.history["tuned"][0]["images"] == [image]

    asyncio.run(scenario())
    assert Path(image).is_file()
