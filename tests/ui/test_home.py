"""History screen: loading, filters, sorting, marks, compare, opening runs (Pilot), on the real-run
fixtures (tests/fixtures/runs, see ui_fixtures.py)."""

from __future__ import annotations

import asyncio

import pytest
from ui_fixtures import FIXED_NOW, REAL_IDS, copy_real_run, real_rows, real_runs, screen_text, test_app, wait_for

from tuiapp.core.run_folder.metrics import JsonlWriter
from tuiapp.ui.screens.compare import CompareScreen
from tuiapp.ui.screens.home import HomeScreen
from tuiapp.ui.screens.run_view import RunViewScreen
from tuiapp.ui.widgets.runs_table import RunsTable


def names(app) -> list[str]:
    return [r.name for r in app.screen.query_one(RunsTable).rows]


def test_history_lists_every_run(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path)
        async with app.run_test(size=(120, 30)) as pilot:
            await wait_for(pilot, lambda: app.screen.summarized, what="summaries")
            assert names(app) == ["live", "crashed", "halted", "sft", "high-lr", "baseline", "stuck"]
            text = screen_text(app)
            last_loss = f"{real_rows('baseline')[-1]['loss']:.4f}"  # as measured by the trainer
            for expected in ("stalled", "running", "succeeded", "failed", "stopped", "40/40", last_loss, "▁"):
                assert expected in text
            assert "7 runs · 2 running" in text

    asyncio.run(scenario())


def test_filter_by_text_status_and_method(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.screen.summarized, what="summaries")
            await pilot.press("slash", *"lr", "enter")
            assert names(app) == ["high-lr"]
            assert isinstance(app.focused, RunsTable)
            await pilot.press("escape")  # clears every filter
            await pilot.pause()
            assert len(names(app)) == 7
            await pilot.press("t")  # status: running
            await pilot.pause()
            assert names(app) == ["live", "stuck"]
            await pilot.press("t")  # flagged: stalled, hung or orphaned
            await pilot.pause()
            assert names(app) == ["stuck"]
            await pilot.press("escape", "m")  # method: the first one in order (dora)
            await pilot.pause()
            assert names(app) == ["halted"]
            await pilot.press("m")  # lora
            await pilot.pause()
            assert names(app) == ["live", "high-lr", "baseline"]
            assert "3 of 7 runs" in screen_text(app)

    asyncio.run(scenario())


def test_sort_by_keys_and_header_click(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path)
        async with app.run_test(size=(120, 30)) as pilot:
            await wait_for(pilot, lambda: app.screen.summarized, what="summaries")
            await pilot.press("s")  # first sortable column: name
            assert names(app) == sorted(names(app))
            await pilot.press("S")
            assert names(app) == sorted(names(app), reverse=True)
            table = app.screen.query_one(RunsTable)
            await pilot.click(RunsTable, offset=(22 + 17 + 11 + 2, 0))  # the 'loss' header
            losses = [r.last_loss for r in table.rows]
            assert app.screen.model.sort_key == "last_loss" and losses == sorted(losses)
            assert "sorted by loss ▲" in screen_text(app)
            await pilot.click(RunsTable, offset=(22 + 17 + 11 + 2, 0))
            assert [r.last_loss for r in table.rows] == sorted(losses, reverse=True)

    asyncio.run(scenario())


@pytest.mark.slow  # over ~1.5 s on 2 cores
def test_mark_two_runs_and_compare_shows_differing_keys(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path)
        async with app.run_test(size=(100, 36)) as pilot:  # narrow: one pane at a time
            await wait_for(pilot, lambda: app.screen.summarized, what="summaries")
            await pilot.press("c")  # nothing marked: a hint, no screen
            assert isinstance(app.screen, HomeScreen)
            await pilot.press("end", "up", "up", "space", "space")  # high-lr, baseline (stuck is the oldest)
            assert [app.screen.model.rows[i].name for i in app.screen.model.marked] == ["high-lr", "baseline"]
            await pilot.press("c")
            assert isinstance(app.screen, CompareScreen)
            await wait_for(pilot, lambda: app.screen.loaded, what="compare data")
            assert app.screen.config_keys() == ["name", "train.learning_rate"]
            await pilot.press("6")  # the config pane
            text = screen_text(app)
            assert "train.learning_rate" in text and "0.05" in text and "0.01" in text
            assert "model.name" not in text
            await pilot.press("a")
            assert "model.name" in app.screen.config_keys()
            await pilot.press("x")
            assert app.screen.axis == "tokens"
            chart = app.screen.query_one("#cmp-chart-loss")
            assert chart.x_label == "tokens" and [label for label, _ in chart.series] == ["high-lr", "baseline"]
            await pilot.press("escape")
            assert isinstance(app.screen, HomeScreen)

    asyncio.run(scenario())


def test_enter_opens_the_run_and_a_new_run_appears_live(tmp_path):
    root = tmp_path / "runs"
    real_runs(root, [name for name in REAL_IDS if name != "live"])

    async def scenario():
        app = test_app(root, tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.screen.summarized, what="summaries")
            assert "live" not in names(app)
            run = copy_real_run(root, "live")  # a real run folder appears while the app runs
            await wait_for(pilot, lambda: "live" in names(app), what="the new run")
            step = real_rows("live")[-1]["step"]
            # the row shows first; its summary (metrics read off the UI thread) follows, later under load
            await wait_for(pilot, lambda: app.screen.model.rows[run.id].step == step, what="the new run's summary")
            with JsonlWriter(run.metrics_path) as writer:
                writer.write({"step": step + 1, "max_steps": 200, "loss": 1.0, "time": FIXED_NOW})
            await wait_for(pilot, lambda: app.screen.model.rows[run.id].step == step + 1, what="the live update")
            await pilot.press("home", "enter")
            assert isinstance(app.screen, RunViewScreen) and app.screen.run_id == run.id
            await pilot.press("escape")
            assert isinstance(app.screen, HomeScreen)

    asyncio.run(scenario())


def test_empty_runs_folder(tmp_path):
    async def scenario():
        app = test_app(tmp_path / "none", tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.screen.loaded, what="load")
            assert "press n for a new experiment" in screen_text(app)

    asyncio.run(scenario())


SIZES = [(80, 24), (120, 36)]


def footer_line(app) -> str:
    return screen_text(app).rstrip("\n").splitlines()[-1]


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "120x36"])
def test_marks_survive_filters_keys_and_footer(runs_root, tmp_path, size):
    """space marks and moves down; marks stay through filters and esc (u clears them); g/G jump;
    the footer fits the width with whole keys, the most important first."""
    async def scenario():
        app = test_app(runs_root, tmp_path)
        async with app.run_test(size=size) as pilot:
            await wait_for(pilot, lambda: app.screen.summarized, what="summaries")
            table = app.screen.query_one(RunsTable)
            await pilot.press("G")
            assert table.cursor == len(table.rows) - 1
            await pilot.press("g")
            assert table.cursor == 0
            await pilot.press("space", "space")  # live, then crashed: the cursor moved down each time
            assert [app.screen.model.rows[i].name for i in app.screen.model.marked] == ["live", "crashed"]
            assert table.cursor == 2
            await pilot.press("slash", *"lr", "enter")
            assert names(app) == ["high-lr"]
            assert "1 of 7 runs" in screen_text(app) and "2 marked" in screen_text(app)
            await pilot.press("escape")  # clears the filter, keeps the marks
            await pilot.pause()
            assert len(names(app)) == 7 and len(app.screen.model.marked) == 2
            assert screen_text(app).count("◆") == 2
            footer = footer_line(app)
            for key in ("⏎ Open", "n New", "space Mark", "c Compare", "/ Filter", "q Quit", "? Help", "^p palette"):
                assert key in footer, footer
            assert ("s Sort" in footer) == (size[0] >= 120)  # less important keys only where they fit
            await pilot.press("u")
            assert app.screen.model.marked == [] and "marked" not in screen_text(app)

    asyncio.run(scenario())


def test_one_run_is_singular(tmp_path):
    real_runs(tmp_path / "runs", ["baseline"])

    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.screen.summarized, what="summaries")
            text = screen_text(app)
            assert "1 run " in text + " " and "1 runs" not in text

    asyncio.run(scenario())


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "120x36"])
def test_garbage_metrics_are_flagged(tmp_path, size):
    runs = real_runs(tmp_path / "runs", ["baseline"])
    runs["baseline"].metrics_path.write_bytes(b"\x00\x01garbage\n{not json\n[1, 2]\n")

    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=size) as pilot:
            await wait_for(pilot, lambda: app.screen.summarized, what="summaries")
            text = screen_text(app)
            assert "metrics unreadable (3 lines" in text  # the line under the table
            assert "⚠ unreadable" in text  # the loss curve's cell
            row = app.screen.model.rows[app.screen.query_one(RunsTable).cursor_run_id]
            assert row.metrics_note() == "metrics unreadable (3 lines of metrics.jsonl are not JSON records)"

    asyncio.run(scenario())


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "120x36"])
def test_q_quits_from_the_run_view(runs_root, tmp_path, size):
    async def scenario():
        app = test_app(runs_root, tmp_path)
        async with app.run_test(size=size) as pilot:
            await wait_for(pilot, lambda: app.screen.summarized, what="summaries")
            await pilot.press("enter")
            assert isinstance(app.screen, RunViewScreen)
            await pilot.press("q")
            await pilot.pause()
            assert app.return_code == 0
        assert not app.is_running

    asyncio.run(scenario())
