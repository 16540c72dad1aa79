"""The run view of a sequence-parallel run gives its degree and each rank's share of a sequence
in the Speed pane (Pilot)."""

from __future__ import annotations

import asyncio

from textual.widgets import Static
from ui_fixtures import synthetic_run, test_app, wait_for

from tuiapp.ui.screens.home import HomeScreen
from tuiapp.ui.screens.run_view import RunViewScreen


def test_the_speed_pane_gives_the_degree_and_the_per_rank_sequence(tmp_path):
    root = tmp_path / "runs"
    run = synthetic_run(root, "long", steps=5)
    recipe = run.path / "recipe.toml"
    text = recipe.read_text(encoding="utf-8")
    assert "sequence_parallel = 1" in text  # the folder's recipe as written, every key
    recipe.write_text(text.replace("sequence_parallel = 1", "sequence_parallel = 4"), encoding="utf-8")

    async def scenario():
        app = test_app(root, tmp_path, live=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen) and app.screen.loaded, what="history")
            app.push_screen(RunViewScreen(run.id))
            await wait_for(pilot, lambda: isinstance(app.screen, RunViewScreen) and app.screen.loaded, what="run view")
            speed = app.screen.query_one("#rv-speed", Static)
            await wait_for(pilot, lambda: "parallel degree 4" in str(speed.render()), what="the sequence line")
            assert "tokens/s counts whole sequences" in str(speed.render())

    asyncio.run(scenario())
