"""The keys do what their hints say, and the words read right (Pilot, on the real-run fixtures):
the sweep's fold key, the Rewards pane's `7`, the history's sideways scroll by column, the
run view's footer and header, the form's verdict, toasts that leave the status line readable, and
the shown status of a stopped or a resumed run."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from manager_fixtures import make_sweep
from ui_fixtures import REAL_IDS, screen_text, synthetic_run, test_app, wait_for

from tuiapp.core.config.recipe import Recipe
from tuiapp.core.store.runs import Run
from tuiapp.ui import actions
from tuiapp.ui.messages import RunStopped
from tuiapp.ui.preview import dataset_preview
from tuiapp.ui.screens.compare import CompareScreen
from tuiapp.ui.screens.home import HomeScreen
from tuiapp.ui.screens.new_experiment import NewExperimentScreen
from tuiapp.ui.screens.run_view import RunViewScreen
from tuiapp.ui.widgets.key_footer import KeyFooter
from tuiapp.ui.widgets.pane_deck import PaneDeck
from tuiapp.ui.widgets.runs_table import COLUMNS, RunsTable


async def home_ready(pilot) -> HomeScreen:
    app = pilot.app
    await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen) and app.screen.summarized, 20, what="history")
    return app.screen


async def open_run(pilot, run_id: str) -> RunViewScreen:
    app = pilot.app
    await home_ready(pilot)
    app.push_screen(RunViewScreen(run_id))
    await wait_for(pilot, lambda: isinstance(app.screen, RunViewScreen) and app.screen.loaded, 20, what="run view")
    return app.screen


async def until(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    """wait_for without Pilot.pause, which waits for the screen to go idle: the form's data
    preview keeps a worker busy for many seconds on a loaded machine."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def lines_of(app) -> list[str]:
    return screen_text(app).rstrip("\n ").splitlines()


def test_the_sweep_rows_hint_names_its_fold_key(runs_root, tmp_path):
    make_sweep(runs_root)

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(120, 30)) as pilot:
            home = await home_ready(pilot)
            await wait_for(pilot, lambda: home.model.group_records, what="the sweep's record")
            assert "enter opens · f unfolds" in screen_text(app)  # g is 'top'; the fold key is f
            await pilot.press("f")
            assert "enter opens · f folds" in screen_text(app)
            await pilot.press("f")
            assert "enter opens · f unfolds" in screen_text(app)

    asyncio.run(scenario())


def test_7_opens_the_rewards_pane_of_a_preference_run(tmp_path):
    root = tmp_path / "runs"
    run = synthetic_run(root, "prefs", method="dpo")

    async def scenario():
        app = test_app(root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            view = await open_run(pilot, run.id)
            assert "7 Rewards" in screen_text(app)  # the tab it labels
            await pilot.press("7")
            assert view.query_one(PaneDeck).active_id == "pane-rewards"
            await pilot.press("1")
            assert view.query_one(PaneDeck).active_id == "pane-loss"

    asyncio.run(scenario())


@pytest.mark.slow  # over ~1.5 s on 2 cores
def test_the_history_scrolls_sideways_by_whole_columns(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await home_ready(pilot)
            table = app.screen.query_one(RunsTable)
            header = lines_of(app)[3]
            assert header.rstrip().endswith("▸") and "◂" not in header  # more columns to the right
            assert not any(line.strip() == "▋" for line in lines_of(app))  # no lone scrollbar glyph
            await pilot.press("right")
            assert table.scroll_offset.x == COLUMNS[0].width  # the status column, whole
            header = lines_of(app)[3]
            assert "◂" in header and header[22:].lstrip(" ◂").startswith("step")
            await pilot.press("right")
            assert table.scroll_offset.x == COLUMNS[0].width + COLUMNS[1].width
            for _ in range(len(COLUMNS)):  # to the end: a handful of presses, not seventy
                await pilot.press("right")
            assert table.scroll_offset.x == table.max_scroll_x
            assert "eval ppl" in lines_of(app)[3] and not lines_of(app)[3].rstrip().endswith("▸")
            await pilot.press("left")
            edges = table.column_edges()
            assert table.scroll_offset.x in edges and table.scroll_offset.x < table.max_scroll_x
            for _ in range(len(COLUMNS)):
                await pilot.press("left")
            assert table.scroll_offset.x == 0 and "◂" not in lines_of(app)[3]

    asyncio.run(scenario())


def test_an_empty_history_names_its_folder(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()

    async def scenario():
        app = test_app(root, tmp_path, live=False)
        async with app.run_test(size=(100, 24)) as pilot:
            await wait_for(pilot, lambda: app.screen.loaded, what="history")
            text = screen_text(app)
            assert f"no runs in {root.resolve()}" in text
            assert "0 runs" not in text

    asyncio.run(scenario())


def test_run_view_header_counts_ranks_in_words_and_footer_keeps_the_main_keys(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await open_run(pilot, REAL_IDS["halted"])  # a stopped run: resume leads
            text = screen_text(app)
            assert "1 rank on cpu" in text and "rank(s)" not in text
            await wait_for(pilot, lambda: "esc Back" in lines_of(app)[-1], what="the footer")
            footer = lines_of(app)[-1]
            for key in ("r Resume", "esc Back", "e Clone", "C Chat", "/ Search log"):
                assert key in footer, footer
            assert "x Stop" not in footer  # nothing to stop
            await pilot.resize_terminal(80, 24)
            await wait_for(pilot, lambda: "esc Back" in lines_of(app)[-1], what="the footer")
            footer = lines_of(app)[-1]
            for key in ("r Resume", "esc Back", "p Pane", "z Zoom"):
                assert key in footer, footer
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await open_run(pilot, REAL_IDS["crashed"])  # two ranks
            assert "2 ranks on cpu" in screen_text(app)

    asyncio.run(scenario())


def test_compares_footer_keeps_whole_keys_at_80_columns(runs_root, tmp_path):
    """Compare's keys overflowed an 80-column footer: the last one was cut ('0' of '0 Reset') and a
    stray letter followed the palette key ('^p paletted')."""
    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.screen.loaded, what="history")
            app.push_screen(CompareScreen([REAL_IDS["baseline"], REAL_IDS["high-lr"]]))
            await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.loaded, what="compare")
            await wait_for(pilot, lambda: "esc Back" in lines_of(app)[-1], what="the footer")
            footer = lines_of(app)[-1].rstrip()
            assert footer.endswith("^p palette"), footer
            for key in ("esc Back", "← Cursor", "+ Zoom in", "- Zoom out"):
                assert key in footer, footer
            keys = footer.removesuffix("^p palette").rstrip(" ▏")
            assert not keys.endswith(" 0"), footer  # no key cut after its letter

    asyncio.run(scenario())


def test_the_footer_is_rebuilt_once_per_change_of_its_keys(runs_root, tmp_path):
    """Textual's footer rebuilt every key on each bindings signal, one rebuild queued per signal
    (five before the form's first frame): now signals in one frame make at most one rebuild, and
    none when the shown keys are the same; a narrower screen still gets its shorter footer."""
    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(120, 36)) as pilot:
            home = await home_ready(pilot)
            footer = home.query_one(KeyFooter)
            await wait_for(pilot, lambda: "esc" in lines_of(app)[-1] or "q Quit" in lines_of(app)[-1], what="keys")
            rebuilds = []
            rebuild = footer.recompose

            async def counted():
                rebuilds.append(lines_of(app)[-1])
                await rebuild()

            footer.recompose = counted
            for _ in range(5):
                home.refresh_bindings()  # what focus moves, resizes and resumes send
            await pilot.pause(0.2)
            assert rebuilds == []  # the same keys: nothing rebuilt
            wide = lines_of(app)[-1]
            await pilot.resize_terminal(80, 24)
            for _ in range(3):
                home.refresh_bindings()
            await wait_for(pilot, lambda: lines_of(app)[-1] != wide, what="the narrow footer")
            await pilot.pause(0.2)
            assert len(rebuilds) == 1
            narrow = lines_of(app)[-1]
            assert narrow.rstrip().endswith("^p palette") and len(narrow.split()) < len(wide.split())
            await pilot.resize_terminal(120, 36)
            await wait_for(pilot, lambda: lines_of(app)[-1] == wide, what="the wide footer back")
            assert len(rebuilds) == 2

    asyncio.run(scenario())


def test_a_stopped_run_never_says_took_0s(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(120, 30)) as pilot:
            view = await open_run(pilot, REAL_IDS["live"])
            assert "elapsed" in screen_text(app)
            # the stop came back while run.json still says running (the supervisor writes it next)
            view.post_message(RunStopped(REAL_IDS["live"], True, "stopped"))
            await wait_for(pilot, lambda: view.record.status == "stopped", what="the stop")
            await pilot.pause(0.1)
            text = screen_text(app)
            assert "took " in text and "took 0s" not in text

    asyncio.run(scenario())


def test_a_resumed_run_whose_steps_count_shows_running_not_its_start_up_phase(runs_root, tmp_path):
    run = Run(runs_root / REAL_IDS["live"]).load()
    rows = [json.loads(line) for line in run.metrics_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    last = max(r["time"] for r in rows if "time" in r)
    attempts = [{"number": 1, "started": last - 500, "ended": last - 300, "outcome": "stopped"},
                {"number": 2, "started": last - 5, "ended": None, "outcome": None, "resumed": True}]
    run.record.set(status="starting", phase="loading model", phase_since=last - 5, attempts=attempts)
    run.save()

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False, clock=lambda: last + 1)
        async with app.run_test(size=(120, 30)) as pilot:
            home = await home_ready(pilot)
            cell = next(r for r in home.query_one(RunsTable).rows if r.id == REAL_IDS["live"])
            assert cell.display_status(last + 1) == "running"
            await open_run(pilot, REAL_IDS["live"])
            text = screen_text(app)
            assert "● running" in text and "loading model" not in text

    asyncio.run(scenario())


def test_toasts_leave_the_status_line_and_the_verdict_bar_readable(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(80, 24), notifications=True) as pilot:
            await home_ready(pilot)
            await wait_for(pilot, lambda: any("7 runs" in line for line in lines_of(app)), what="the status line")
            lines = lines_of(app)
            row = next(i for i, line in enumerate(lines) if "7 runs" in line)  # the footer may paint later
            status, detail = lines[row].rstrip(), lines[row - 1].rstrip()
            assert detail.strip()
            app.notify("a long notice that would cover the bottom right of the screen", title="Notice", timeout=30)
            await wait_for(pilot, lambda: "a long notice" in screen_text(app), what="the toast")
            after = [line.rstrip() for line in lines_of(app)]
            assert after[row] == status and after[row - 1] == detail  # status and detail lines whole
            assert "a long notice" in screen_text(app)

    asyncio.run(scenario())


@pytest.mark.slow  # over ~5 s on 2 cores
def test_form_verdict_counts_errors_as_the_checks_pane_does_and_cpu_speaks_of_ranks(tmp_path):
    missing = Recipe.model_validate({"name": "q", "method": {"kind": "lora"},
                                      "dataset": {"name": "data/missing.jsonl"}})  # one preflight error

    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path, live=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.screen.loaded, what="history")
            app.open_form(missing)
            await until(lambda: isinstance(app.screen, NewExperimentScreen) and app.screen.last_check is not None,
                        what="the check")
            text = screen_text(app)
            checks = str(app.screen.query_one("#ne-checks").render())
            assert "preflight: 1 error" in checks
            assert "✗ 1 error: " in text and "problem(s)" not in text
            estimate = str(app.screen.query_one("#ne-estimate").render())
            assert "world size" not in estimate  # `1 GPU (world size 1)` said the count twice
            if actions.machine_on_cpu():  # no CUDA: the ranks are CPU processes
                assert "1 CPU rank" in estimate and "GPU" not in estimate

    asyncio.run(scenario())


def test_the_records_preview_leaves_out_empty_columns():
    class Info:
        source, format, count, columns = "data/chat.jsonl", "messages", 1, ["messages", "tools"]
        examples = [{"messages": [{"role": "user", "content": "hi"}], "tools": None}]

    text = dataset_preview("data/chat.jsonl", Info(), None)
    assert "user: hi" in text and "tools: null" not in text and "null" not in text
