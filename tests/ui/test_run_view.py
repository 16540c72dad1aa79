"""Run view: live metrics and logs, a finished run whole, panes, help and the palette (Pilot)."""

from __future__ import annotations

import asyncio
import time

from ui_fixtures import FIXED_NOW, screen_text, test_app, wait_for

from tuiapp.core.metrics import JsonlWriter
from tuiapp.core.runs import RunStore
from tuiapp.ui.commands import screen_actions
from tuiapp.ui.screens.help import HelpScreen
from tuiapp.ui.screens.home import HomeScreen
from tuiapp.ui.screens.new_experiment import NewExperimentScreen
from tuiapp.ui.screens.run_view import RunViewScreen
from tuiapp.ui.widgets.charts import MetricChart
from tuiapp.ui.widgets.log_tail import LogTail


async def open_run(pilot, run_id: str) -> RunViewScreen:
    app = pilot.app
    await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen) and app.screen.loaded, what="home")
    app.push_screen(RunViewScreen(run_id))
    await wait_for(pilot, lambda: isinstance(app.screen, RunViewScreen) and app.screen.loaded, what="run view")
    return app.screen


def run_id(root, name: str) -> str:
    return RunStore(root).get(name).id


def test_appended_metric_reaches_the_loss_chart_within_two_seconds(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await open_run(pilot, run_id(runs_root, "live-one"))
            assert len(screen.data.loss) == 30
            chart = screen.query_one("#chart-loss", MetricChart)
            with JsonlWriter(runs_root / screen.run_id / "metrics.jsonl") as writer:
                started = time.monotonic()
                writer.write({"step": 31, "max_steps": 100, "loss": 0.123, "lr": 1e-4, "time": FIXED_NOW, "tokens": 70000})
            await wait_for(pilot, lambda: len(screen.data.loss) == 31, timeout=2.0, what="the new row")
            assert time.monotonic() - started < 2.0
            assert screen.data.loss.ys[-1] == 0.123
            assert chart.series[0][1] is screen.data.loss  # the chart draws this very series
            await pilot.pause(0.1)
            assert chart.points_drawn >= 31
            assert "step 31/100" in screen_text(app)

    asyncio.run(scenario())


def test_log_tail_follows_appended_lines_and_switches_source(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await open_run(pilot, run_id(runs_root, "live-one"))
            await pilot.press("5")  # the log pane
            log = screen.query_one("#rv-log", LogTail)
            await wait_for(pilot, lambda: any("step 21/100" in line for line in log.lines), what="the log")
            with open(runs_root / screen.run_id / "stdout.log", "a", encoding="utf-8") as handle:
                handle.write("[rank0] a brand new line\n\x1b[32mgreen\x1b[0m\n")
            await wait_for(pilot, lambda: "green" in log.lines[-1:] and "[rank0] a brand new line" in log.lines, timeout=2.0, what="appended lines")
            assert "a brand new line" in screen_text(app)
            await pilot.press("l")  # ranks/rank0.log
            await wait_for(pilot, lambda: list(log.lines) == ["rank 0 ready", "rank 0 training"], what="rank log")
            await pilot.press("l")  # back to stdout
            await wait_for(pilot, lambda: "green" in log.lines, what="stdout again")

    asyncio.run(scenario())


def test_finished_run_is_shown_whole(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path)
        async with app.run_test(size=(160, 48)) as pilot:
            screen = await open_run(pilot, run_id(runs_root, "high-lr"))
            assert len(screen.data.loss) == 40 and len(screen.data.eval_loss) == 4
            assert len(screen.data.memory["rank0"]) == 40
            text = screen_text(app)
            assert "succeeded" in text and "step 40/40" in text and "Paris (step 40)" in text
            assert "took 1m25s" in text and "rank0 cpu" in text
            assert screen.check_action("stop", ()) is None and screen.check_action("resume", ()) is None
            await pilot.press("x")  # disabled: nothing happens
            assert app.screen is screen

    asyncio.run(scenario())


def test_failed_run_shows_its_reason_and_can_resume(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await open_run(pilot, run_id(runs_root, "full-sft"))
            await wait_for(pilot, lambda: screen.info.get("status") == "failed", what="status")
            assert "CUDA out of memory" in screen_text(app)
            assert screen.check_action("resume", ()) is True
            stalled = await open_stalled(pilot, runs_root)
            assert "stalled: no step for 15m00s" in screen_text(app)
            assert stalled.check_action("stop", ()) is True

    async def open_stalled(pilot, root):
        pilot.app.pop_screen()
        return await open_run(pilot, run_id(root, "stuck"))

    asyncio.run(scenario())


def test_panes_zoom_help_and_palette(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_run(pilot, run_id(runs_root, "baseline"))
            deck = screen.query_one("#rv-deck")
            await pilot.press("p")
            assert deck.active_id == "pane-lr"
            await pilot.press("6")
            assert deck.active_id == "pane-samples" and "Paris" in screen_text(app)
            await pilot.press("z")
            assert screen.maximized is not None
            await pilot.press("escape")
            assert screen.maximized is None and app.screen is screen
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            text = screen_text(app)
            for line in ("Stop", "Resume", "Clone", "Log source", "Zoom", "Back", "Palette"):
                assert line in text
            await pilot.press("escape")
            titles = [a.title for a in screen_actions(screen)]
            assert titles[:4] == ["Stop", "Resume", "Clone", "Log source"] and "Help" in titles
            await pilot.press("ctrl+p")
            await pilot.press(*"clone")
            await pilot.pause(0.3)
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, NewExperimentScreen), what="clone from the palette")
            assert app.screen.collect()["name"] == "baseline"

    asyncio.run(scenario())


def test_themes_restyle_every_screen(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await open_run(pilot, run_id(runs_root, "baseline"))
            for theme in ("textual-light", "nord", "gruvbox"):
                app.theme = theme
                await pilot.pause()
                text = screen_text(app)
                assert "step 40/40" in text and "loss (train, eval)" in text  # same frame, new colours
            await pilot.press("f1")
            assert isinstance(app.screen, HelpScreen)

    asyncio.run(scenario())
