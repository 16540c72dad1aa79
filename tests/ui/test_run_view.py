"""Run view: live metrics and logs, a finished run whole, panes, help and the palette (Pilot), on
the real-run fixtures (tests/fixtures/runs, see ui_fixtures.py)."""

from __future__ import annotations

import asyncio
import time

import pytest
from ui_fixtures import FIXED_NOW, real_info, real_rows, screen_text, test_app, wait_for

from tuiapp.core.run_folder.metrics import JsonlWriter
from tuiapp.core.run_folder.progress import fmt_duration
from tuiapp.core.store.runs import RunStore
from tuiapp.ui.commands import screen_actions
from tuiapp.ui.screens.help import HelpScreen
from tuiapp.ui.screens.home import HomeScreen
from tuiapp.ui.screens.new_experiment import NewExperimentScreen
from tuiapp.ui.screens.run_view import RunViewScreen
from tuiapp.ui.widgets.charts import MetricChart
from tuiapp.ui.widgets.log_tail import LogTail


async def open_run(pilot, run_id: str, timeout: float = 10.0) -> RunViewScreen:
    app = pilot.app
    await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen) and app.screen.loaded, timeout, what="home")
    app.push_screen(RunViewScreen(run_id))
    await wait_for(pilot, lambda: isinstance(app.screen, RunViewScreen) and app.screen.loaded, timeout, what="run view")
    return app.screen


def run_id(root, name: str) -> str:
    return RunStore(root).get(name).id


def test_appended_metric_reaches_the_loss_chart_within_two_seconds(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await open_run(pilot, run_id(runs_root, "live"))
            rows = real_rows("live")
            step = rows[-1]["step"]
            assert len(screen.data.loss) == len(rows) == step
            chart = screen.query_one("#chart-loss", MetricChart)
            with JsonlWriter(runs_root / screen.run_id / "metrics.jsonl") as writer:
                started = time.monotonic()
                writer.write({"step": step + 1, "max_steps": 200, "loss": 0.123, "lr": 1e-4, "time": FIXED_NOW, "tokens": 70000})
            await wait_for(pilot, lambda: len(screen.data.loss) == step + 1, timeout=2.0, what="the new row")
            assert time.monotonic() - started < 2.0
            assert screen.data.loss.ys[-1] == 0.123
            assert chart.series[0][1] is screen.data.loss  # the chart draws this very series
            await pilot.pause(0.1)
            assert chart.points_drawn >= step + 1
            assert f"step {step + 1}/200" in screen_text(app)

    asyncio.run(scenario())


@pytest.mark.slow  # over ~5 s on 2 busy cores
def test_log_tail_follows_appended_lines_and_switches_source(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await open_run(pilot, run_id(runs_root, "live"))
            await pilot.press("5")  # the log pane
            log = screen.query_one("#rv-log", LogTail)
            rank_log = next((runs_root / screen.run_id / "ranks").glob("*_rank0.log"))
            last = rank_log.read_text(encoding="utf-8").splitlines()[-1]  # the trainer's last log line
            await wait_for(pilot, lambda: log.lines and log.lines[-1] == last, what="rank 0's log, shown first")
            await pilot.press("l")  # the launcher's stdout.log
            await wait_for(pilot, lambda: any("dist_world_size=1" in line for line in log.lines), what="stdout")
            with open(runs_root / screen.run_id / "stdout.log", "a", encoding="utf-8") as handle:
                handle.write("[rank0] a brand new line\n\x1b[32mgreen\x1b[0m\n")
            await wait_for(pilot, lambda: "green" in log.lines[-1:] and "[rank0] a brand new line" in log.lines, what="appended lines")
            await wait_for(pilot, lambda: "a brand new line" in screen_text(app), what="the new line drawn")
            await pilot.press("l")  # back to rank 0
            await wait_for(pilot, lambda: log.lines and log.lines[-1] == last and "green" not in log.lines, what="rank log")

    asyncio.run(scenario())


@pytest.mark.slow  # two attempts followed live: ~7 s on 2 cores
def test_a_resumed_attempts_log_takes_over_unless_the_user_chose_one(runs_root, tmp_path):
    """A resume's rank 0 writes a new log (named by the attempt's start): the open view follows it,
    as it followed the first one; once the user picked a log with `l`, that choice stays."""
    async def scenario():
        app = test_app(runs_root, tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await open_run(pilot, run_id(runs_root, "halted"))
            await pilot.press("5")
            log = screen.query_one("#rv-log", LogTail)
            ranks = runs_root / screen.run_id / "ranks"
            await wait_for(pilot, lambda: screen.sources[screen.source_index][0].endswith("_rank0.log"), what="rank 0")
            (ranks / "20260101001000_rank0.log").write_text("the second attempt trains\n", encoding="utf-8")
            await wait_for(pilot, lambda: "the second attempt trains" in log.lines, timeout=10,
                           what="the new attempt's log followed")
            assert "ranks/20260101001000_rank0.log" in screen_text(app)
            await pilot.press("l")  # the user's choice: the supervisor's log, or the next one
            chosen = screen.sources[screen.source_index][0]
            (ranks / "20260101002000_rank0.log").write_text("a third attempt\n", encoding="utf-8")
            await wait_for(pilot, lambda: "ranks/20260101002000_rank0.log" in [label for label, _ in screen.sources],
                           timeout=10, what="the new log listed")
            assert screen.sources[screen.source_index][0] == chosen and "a third attempt" not in log.lines

    asyncio.run(scenario())


@pytest.mark.slow  # over ~5 s on 2 busy cores
def test_finished_run_is_shown_whole(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path)
        async with app.run_test(size=(160, 48)) as pilot:
            screen = await open_run(pilot, run_id(runs_root, "sft"))
            assert len(screen.data.loss) == 40 and len(screen.data.eval_loss) == 4
            assert list(screen.data.loss.ys) == [r["loss"] for r in real_rows("sft")]
            assert len(screen.data.memory["rank0"]) == 40
            info, sample = real_info("sft"), real_rows("sft", "eval")[-1]["samples"][-1]
            text = screen_text(app)
            assert "succeeded" in text and "step 40/40" in text and sample["prompt"] in text
            assert sample["output"].split()[0] in text  # what the model answered at the last eval
            assert f"took {fmt_duration(info['ended'] - info['started'])}" in text and "rank0 cpu" in text
            assert screen.check_action("stop", ()) is None and screen.check_action("resume", ()) is None
            await pilot.press("x")  # disabled: nothing happens
            assert app.screen is screen

    asyncio.run(scenario())


def test_failed_run_shows_its_reason_and_can_resume(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await open_run(pilot, run_id(runs_root, "crashed"), timeout=4.0)  # rank 1 was SIGKILLed
            await wait_for(pilot, lambda: screen.record.status == "failed", timeout=4.0, what="status")
            assert "local rank 1 was killed by signal 9" in screen_text(app)  # the reason's summary
            assert screen.check_action("resume", ()) is True

    asyncio.run(scenario())


def test_stalled_run_says_so_and_can_be_stopped(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(100, 30)) as pilot:
            stalled = await open_run(pilot, run_id(runs_root, "stuck"))
            hung = FIXED_NOW - real_rows("stuck")[-1]["time"]  # its rank was frozen with SIGSTOP
            assert hung > 120 and f"stalled: no step for {fmt_duration(hung)}" in screen_text(app)
            assert stalled.check_action("stop", ()) is True and stalled.check_action("resume", ()) is None

    asyncio.run(scenario())


@pytest.mark.slow  # ~5.5 s on 2 cores
def test_panes_zoom_help_and_palette(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_run(pilot, run_id(runs_root, "baseline"))
            deck = screen.query_one("#rv-deck")
            await pilot.press("p")
            assert deck.active_id == "pane-lr"
            await pilot.press("6")
            assert deck.active_id == "pane-samples" and "capital of Japan" in screen_text(app)
            await pilot.press("z")
            assert screen.maximized is not None
            await pilot.press("escape")
            assert screen.maximized is None and app.screen is screen
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            text = str(app.screen.query_one("#help-text").render())  # all of it, scrolled or not
            for line in ("Stop", "Resume", "Clone", "Log source", "Zoom", "Back", "Palette"):
                assert line in text
            assert "Stop" in screen_text(app)
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


@pytest.mark.slow  # over ~5 s on 2 busy cores
def test_themes_restyle_every_screen(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await open_run(pilot, run_id(runs_root, "baseline"))
            for theme in ("textual-light", "nord", "gruvbox"):
                app.theme = theme
                await pilot.pause()
                text = screen_text(app)
                title = app.screen.query_one("#chart-loss").title_text  # legend on the title line
                assert "step 40/40" in text and title.startswith("loss") and "train" in title and "eval" in title
                assert title.split("  ")[0] in text  # same frame, new colours
            await pilot.press("f1")
            assert isinstance(app.screen, HelpScreen)

    asyncio.run(scenario())


@pytest.mark.slow  # over ~5 s on 2 busy cores
@pytest.mark.parametrize("size", [(80, 24), (120, 36)], ids=["80x24", "120x36"])
def test_log_pane_wraps_searches_follows_and_goes_full_screen(runs_root, tmp_path, size):
    rank_log = next((runs_root / run_id(runs_root, "sft") / "ranks").glob("*_rank0.log"))
    with open(rank_log, "a", encoding="utf-8") as handle:  # a long line, and a word twice
        handle.write("needle one " + "x" * 150 + " TAILEND\nhay\nsecond needle here\n")

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=size) as pilot:
            screen = await open_run(pilot, run_id(runs_root, "sft"))
            log = screen.query_one("#rv-log", LogTail)
            await wait_for(pilot, lambda: log.lines and log.lines[-1] == "second needle here", what="rank 0's log first")
            assert "rank0.log" in screen.sources[screen.source_index][0]
            await pilot.press("5")  # the log pane
            await pilot.pause()
            assert log.soft_wrap and "TAILEND" in screen_text(app)  # the long line wraps: its end is on screen
            # search: / opens the box, enter selects the first match after the cursor; n / N move
            await pilot.press("home")
            await pilot.press("slash")
            await pilot.press(*"needle", "enter")
            first = log.match
            assert first is not None and log.selected_text == "needle"
            assert log.lines[first[0]].startswith("needle one")
            await pilot.press("n")
            assert log.lines[log.match[0]] == "second needle here" and log.selected_text == "needle"
            await pilot.press("N")
            assert log.match == first
            assert not log.following  # a search stops following; end follows again
            await pilot.press("end")
            assert log.following
            # z: the log pane full screen, and back
            await pilot.press("z")
            assert screen.maximized is screen.query_one("#pane-log")
            assert log.size.width >= size[0] - 6
            await pilot.press("z")
            assert screen.maximized is None
            await pilot.press("slash", "escape")  # esc closes the search box, not the screen
            assert app.screen is screen

    asyncio.run(scenario())


@pytest.mark.slow  # over ~5 s on 2 busy cores
def test_grad_norm_is_charted_and_every_eval_has_its_samples(runs_root, tmp_path):
    path = runs_root / run_id(runs_root, "live")
    step = real_rows("live")[-1]["step"]
    with JsonlWriter(path / "metrics.jsonl") as writer:
        writer.write({"step": step + 1, "max_steps": 200, "loss": 1.0, "grad_norm": 0.75, "time": FIXED_NOW})

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await open_run(pilot, run_id(runs_root, "sft"))
            text = str(screen.query_one("#rv-samples").render())
            for step in (10, 20, 30, 40):
                assert f"samples at step {step}" in text
            await pilot.press("escape")
            screen = await open_run(pilot, path.name)
            grad = screen.query_one("#chart-grad", MetricChart)
            assert list(grad.series[0][1].ys) == [0.75] and grad.series[0][1] is screen.data.series["grad_norm"]

    asyncio.run(scenario())
