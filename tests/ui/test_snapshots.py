"""Snapshots (pytest-textual-snapshot) of every screen at 80x24 and 160x48 (compare and the run
view's log also at 120x36).

The runs shown are the real-run fixtures (tests/fixtures/runs, made by tests/fixtures/make_runs.py
from real trainer runs: measured losses, lrs, eval samples, logs). Deterministic: those folders
have normalised timestamps, ids, paths and pids; a frozen clock (the fixtures' capture time),
TZ=UTC, no GPU or host monitor, no HF cache scan, no polling (live=False).
Update with `--snapshot-update`.
"""

from __future__ import annotations

import pytest
from manager_fixtures import make_sweep
from rl_fixtures import rl_run
from ui_fixtures import test_app, wait_for

from tuiapp.core.store.runs import RunStore
from tuiapp.ui.screens.compare import CompareScreen
from tuiapp.ui.screens.group import GroupScreen
from tuiapp.ui.screens.new_experiment import NewExperimentScreen
from tuiapp.ui.screens.run_view import RunViewScreen

SIZES = [(80, 24), (160, 48)]


def _app(runs_root, tmp_path):
    return test_app(runs_root, tmp_path, live=False)


async def _home_ready(pilot):
    await wait_for(pilot, lambda: pilot.app.screen.summarized, what="history")


async def _compare_ready(pilot):
    await wait_for(
        pilot, lambda: isinstance(pilot.app.screen, CompareScreen) and pilot.app.screen.loaded, what="compare"
    )


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "160x48"])
def test_home(snap_compare, runs_root, tmp_path, size):
    assert snap_compare(_app(runs_root, tmp_path), terminal_size=size, run_before=_home_ready)


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "160x48"])
@pytest.mark.slow  # over ~5 s on 2 busy cores
def test_new_experiment(snap_compare, runs_root, tmp_path, size):
    async def run_before(pilot):
        await _home_ready(pilot)
        await pilot.press("n")
        screen = pilot.app.screen
        assert isinstance(screen, NewExperimentScreen)
        await wait_for(pilot, lambda: screen.last_check is not None, what="check")
        await wait_for(pilot, lambda: "alpaca" in str(screen.query_one("#ne-data").render()), what="preview")
        screen.query_one("#f-name").cursor_blink = False

    assert snap_compare(_app(runs_root, tmp_path), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "160x48"])
def test_run_view(snap_compare, runs_root, tmp_path, size):
    run_id = RunStore(runs_root).get("sft").id  # full fine-tune: loss 7.5 -> 3.1, two sample prompts

    async def run_before(pilot):
        await _home_ready(pilot)
        pilot.app.push_screen(RunViewScreen(run_id))
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, RunViewScreen) and pilot.app.screen.loaded, what="run")
        await wait_for(pilot, lambda: pilot.app.screen.record.status == "succeeded", what="status")
        await wait_for(pilot, lambda: len(pilot.app.screen.query_one("#rv-log").lines) > 0, what="log")

    assert snap_compare(_app(runs_root, tmp_path), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "160x48"])
def test_run_view_generations(snap_compare, tmp_path, size):
    """A grpo run's Generations pane, on step 4 of 5 ([ once): prompts, completions, every score.
    SYNTHETIC run folder in the trainer's format (rl_fixtures.py): no real RL run is a fixture."""
    root = tmp_path / "runs"
    run = rl_run(root, "tiny-grpo", steps=5)

    async def run_before(pilot):
        await _home_ready(pilot)
        pilot.app.push_screen(RunViewScreen(run.id))
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, RunViewScreen) and pilot.app.screen.loaded, what="run")
        await wait_for(pilot, lambda: pilot.app.screen.generations.current == (5, "train"), what="generations")
        await pilot.press("7", "left_square_bracket")
        await pilot.pause()

    assert snap_compare(_app(root, tmp_path), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "160x48"])
def test_compare(snap_compare, runs_root, tmp_path, size):
    ids = [RunStore(runs_root).get(name).id for name in ("baseline", "high-lr", "sft")]

    async def run_before(pilot):
        await _home_ready(pilot)
        pilot.app.push_screen(CompareScreen(ids))
        await _compare_ready(pilot)

    assert snap_compare(_app(runs_root, tmp_path), terminal_size=size, run_before=run_before)


def test_compare_config_80x24(snap_compare, runs_root, tmp_path):
    """At 80x24 one pane shows at a time: the config pane, the keys that differ between two runs."""
    ids = [RunStore(runs_root).get(name).id for name in ("baseline", "high-lr")]

    async def run_before(pilot):
        await _home_ready(pilot)
        pilot.app.push_screen(CompareScreen(ids))
        await _compare_ready(pilot)
        await pilot.press("6")
        await pilot.pause()

    assert snap_compare(_app(runs_root, tmp_path), terminal_size=(80, 24), run_before=run_before)


def test_compare_config_120x36(snap_compare, runs_root, tmp_path):
    """At 120x36 the config pane takes a whole row of the grid: three runs' columns side by side,
    long values cut in their middle, the highlighted key's whole values under the table."""
    ids = [RunStore(runs_root).get(name).id for name in ("baseline", "high-lr", "sft")]

    async def run_before(pilot):
        await _home_ready(pilot)
        pilot.app.push_screen(CompareScreen(ids))
        await _compare_ready(pilot)
        await pilot.press("6")
        pilot.app.screen.query_one("#cmp-config").focus()
        await pilot.press("down", "down")
        await pilot.pause()

    assert snap_compare(_app(runs_root, tmp_path), terminal_size=(120, 36), run_before=run_before)


@pytest.mark.parametrize("size", [(80, 24), (120, 36)], ids=["80x24", "120x36"])
@pytest.mark.slow  # over ~5 s on 2 busy cores
def test_compare_zoomed_chart_with_its_legend(snap_compare, runs_root, tmp_path, size):
    """z on the loss chart: it fills the screen and keeps the legend beside it (each run's glyph,
    name and value at the cursor)."""
    ids = [RunStore(runs_root).get(name).id for name in ("baseline", "high-lr", "sft")]

    async def run_before(pilot):
        await _home_ready(pilot)
        pilot.app.push_screen(CompareScreen(ids))
        await _compare_ready(pilot)
        await pilot.press("z", *["left"] * 5)
        await pilot.pause()

    assert snap_compare(_app(runs_root, tmp_path), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [(80, 24), (120, 36)], ids=["80x24", "120x36"])
@pytest.mark.slow  # over ~5 s on 2 busy cores
def test_compare_smoothed_with_cursor(snap_compare, runs_root, tmp_path, size):
    """Three runs smoothed (EMA 0.6), the cursor moved back ten steps: the side table beside
    the plot reads each run's value there; every run has its glyph."""
    ids = [RunStore(runs_root).get(name).id for name in ("baseline", "high-lr", "sft")]

    async def run_before(pilot):
        await _home_ready(pilot)
        pilot.app.push_screen(CompareScreen(ids))
        await _compare_ready(pilot)
        await pilot.press("s", "s", *["left"] * 10)
        await pilot.pause()

    assert snap_compare(_app(runs_root, tmp_path), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [(80, 24), (120, 36)], ids=["80x24", "120x36"])
@pytest.mark.slow  # over ~5 s on 2 busy cores
def test_run_view_log_searched(snap_compare, runs_root, tmp_path, size):
    """The run view's log pane: rank 0's log, wrapped, the match of a search selected."""
    run_id = RunStore(runs_root).get("sft").id

    async def run_before(pilot):
        await _home_ready(pilot)
        pilot.app.push_screen(RunViewScreen(run_id))
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, RunViewScreen) and pilot.app.screen.loaded, what="run")
        await wait_for(pilot, lambda: len(pilot.app.screen.query_one("#rv-log").lines) > 0, what="log")
        await pilot.press("5", "home", "slash", *"train_loss", "enter", "z")
        await pilot.pause()

    assert snap_compare(_app(runs_root, tmp_path), terminal_size=size, run_before=run_before)


def test_history_with_a_sweep_80x24(snap_compare, runs_root, tmp_path):
    """A 2x2 sweep (made by the real core, tests/ui/manager_fixtures.py) unfolded under its row:
    progress 3/4, the best eval loss and its combination; its runs named by what varies."""
    make_sweep(runs_root)

    async def run_before(pilot):
        await _home_ready(pilot)
        await wait_for(pilot, lambda: pilot.app.screen.model.group_records, what="the sweep")
        await pilot.press("f")
        await pilot.pause()

    assert snap_compare(_app(runs_root, tmp_path), terminal_size=(80, 24), run_before=run_before)


def test_group_screen_80x24(snap_compare, runs_root, tmp_path):
    """The sweep's screen: runs ranked by best eval loss, the varied keys, and the heat map."""
    make_sweep(runs_root)

    async def run_before(pilot):
        await _home_ready(pilot)
        await wait_for(pilot, lambda: pilot.app.screen.model.group_records, what="the sweep")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, GroupScreen) and pilot.app.screen.loaded,
                       what="the group screen")
        await pilot.pause()

    assert snap_compare(_app(runs_root, tmp_path), terminal_size=(80, 24), run_before=run_before)


FORM_SIZES = [(80, 24), (120, 36)]


@pytest.mark.parametrize("size", FORM_SIZES, ids=["80x24", "120x36"])
def test_history_marks_kept_under_a_filter(snap_compare, runs_root, tmp_path, size):
    """Two runs marked, then a filter that hides one of them: the marks stay (2 marked), and the
    footer shows the keys that fit the width, whole."""
    async def run_before(pilot):
        await _home_ready(pilot)
        await pilot.press("down", "down", "down", "space", "space", "slash", *"lr", "enter")
        await pilot.pause()

    assert snap_compare(_app(runs_root, tmp_path), terminal_size=size, run_before=run_before)


async def _form(pilot):
    await _home_ready(pilot)
    await pilot.press("n")
    screen = pilot.app.screen
    assert isinstance(screen, NewExperimentScreen)
    await wait_for(pilot, lambda: screen.last_check is not None and screen.filled, what="check, every section")
    for widget in screen.query("Input, TextArea"):
        widget.cursor_blink = False
    await pilot.pause()
    return screen


@pytest.mark.parametrize("size", FORM_SIZES, ids=["80x24", "120x36"])
@pytest.mark.slow  # the form: over ~5 s on 2 busy cores
def test_form_focus_ring_and_help_line(snap_compare, runs_root, tmp_path, size):
    """The focused field (its label an accent tab) and its description in the help line."""
    async def run_before(pilot):
        screen = await _form(pilot)
        screen.query_one("#f-description").focus()
        await pilot.pause()

    assert snap_compare(_app(runs_root, tmp_path), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", FORM_SIZES, ids=["80x24", "120x36"])
@pytest.mark.slow
def test_form_open_picker(snap_compare, runs_root, tmp_path, size):
    """ctrl+o: the recipes and presets, fuzzy-filtered by what is typed."""
    async def run_before(pilot):
        await _form(pilot)
        await pilot.press("ctrl+o", *"dpo")
        await wait_for(pilot, lambda: pilot.app.screen.query_one("CommandList").option_count > 0, what="the picker")
        pilot.app.screen.query_one("Input").cursor_blink = False
        await pilot.pause(0.3)

    assert snap_compare(_app(runs_root, tmp_path), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", FORM_SIZES, ids=["80x24", "120x36"])
@pytest.mark.slow
def test_form_confirm_discard(snap_compare, runs_root, tmp_path, size):
    """esc on a form with edits asks before it drops them."""
    async def run_before(pilot):
        screen = await _form(pilot)
        screen.query_one("#f-name").value = "edited"
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()

    assert snap_compare(_app(runs_root, tmp_path), terminal_size=size, run_before=run_before)
