"""Evaluate (E) and Export (X) from the history and the run view, the fast part: the keys open
their forms on a run with a final model and say why not on one without, the forms fit 80x24, and
what the forms or core refuse (a limit that is no number, a final model without weights, a folder that is not empty) is shown in the form with its fix, never a traceback.
The real evaluation and export of a trained run are in test_evaluate_export_real.py (slow)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from textual.widgets import Checkbox, Input, Static
from ui_fixtures import REAL_IDS, screen_text, test_app, wait_for

from tuiapp.ui.screens.evaluate import EvaluateScreen, data_argument, parse_limit
from tuiapp.ui.screens.export import ExportScreen, files_text
from tuiapp.ui.screens.home import HomeScreen
from tuiapp.ui.screens.run_view import RunViewScreen
from tuiapp.ui.widgets.runs_table import RunsTable


async def _home(pilot, run_id: str) -> HomeScreen:
    app = pilot.app
    await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen) and app.screen.loaded, what="home")
    app.screen.query_one(RunsTable).move_to_id(run_id)
    await pilot.pause()
    return app.screen


async def _evaluate_form(pilot, run_id: str) -> EvaluateScreen:
    """E on the run's row of the history: its Evaluate form."""
    await _home(pilot, run_id)
    await pilot.press("E")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, EvaluateScreen), what="the form")
    return pilot.app.screen


def _error(screen) -> str:
    return str(screen.query_one("#tool-error", Static).render())


def test_a_run_without_a_final_model_is_not_offered(runs_root, tmp_path):
    run_id = REAL_IDS["crashed"]

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await _home(pilot, run_id)
            await pilot.press("E")
            await wait_for(pilot, lambda: any("has no final model (failed)" in n.message for n in app._notifications),
                           what="the toast")
            assert isinstance(app.screen, HomeScreen)
            await pilot.press("X")
            await wait_for(pilot, lambda: any("export a succeeded run" in n.message for n in app._notifications),
                           what="the export's toast")
            assert isinstance(app.screen, HomeScreen)

    asyncio.run(scenario())


def test_evaluate_form_fits_80x24_and_shows_refusals_with_their_fix(runs_root, tmp_path):
    run_id = REAL_IDS["sft"]
    (runs_root / run_id / "final").mkdir()  # a final folder without weights: core refuses it

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            form = await _evaluate_form(pilot, run_id)
            text = screen_text(app)
            for words in ("Evaluate sft", "demo:facts-heldout", "limit", "the base model too",
                          "esc closes"):
                assert words in text, words
            form.query_one("#eval-limit", Input).value = "lots"
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: "is not a number of records" in _error(form), what="the limit refused")
            assert "fix: type 0 for all" in _error(form)
            form.query_one("#eval-limit", Input).value = "5"
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: not form.running and _error(form), what="the weights refused")
            assert "final lacks a config" in _error(form) and "Traceback" not in screen_text(app)
            assert "fix:" in _error(form)
            assert "✗" in screen_text(app)  # drawn inside the 80x24 frame
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen), what="closed")

    asyncio.run(scenario())


def test_evaluate_of_a_run_on_its_own_data_starts_empty_and_asks_for_held_out_data(runs_root, tmp_path):
    run_id = REAL_IDS["sft"]
    recipe = runs_root / run_id / "recipe.toml"
    recipe.write_text(recipe.read_text().replace('name = "demo:facts"', f'name = "{tmp_path / "mine.jsonl"}"'))
    (tmp_path / "mine.jsonl").write_text('{"instruction": "Say hi", "output": "hi"}\n')
    (runs_root / run_id / "final").mkdir()  # E is offered on a run with a final model

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            form = await _evaluate_form(pilot, run_id)
            assert form.query_one("#eval-data", Input).value == ""  # not the demo facts it never saw
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: "name the held-out data" in _error(form), what="the refusal")
            assert "fix: type the path of a file with records the run did not train on" in _error(form)

    asyncio.run(scenario())


def test_export_refuses_a_folder_that_is_not_empty_in_the_form(runs_root, tmp_path):
    run_id = REAL_IDS["sft"]
    (runs_root / run_id / "final").mkdir()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "something.txt").write_text("mine")

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen) and app.screen.loaded, what="home")
            app.open_run(run_id)
            await wait_for(pilot, lambda: isinstance(app.screen, RunViewScreen) and app.screen.loaded, what="run")
            await pilot.press("X")
            await wait_for(pilot, lambda: isinstance(app.screen, ExportScreen), what="the form")
            form = app.screen
            text = screen_text(app)
            for words in ("Export sft", f"exports/{run_id}", "dtype", "as trained",
                          "merge: no adapter, every weight trained"):  # a full fine-tune: nothing to merge
                assert words in text, words
            assert form.query_one("#export-merge", Checkbox).disabled
            form.query_one("#export-out", Input).value = "taken"  # relative to the app's folder
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: not form.running and _error(form), what="the refusal")
            assert f"{taken} exists and is not empty" in _error(form)
            assert "fix: choose a new folder" in _error(form)
            assert (taken / "something.txt").read_text() == "mine"
            form.query_one("#export-out", Input).value = ""
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: "no folder to export to" in _error(form), what="an empty folder name")
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, RunViewScreen), what="back to the run")

    asyncio.run(scenario())


def test_the_palette_and_help_list_evaluate_and_export(runs_root, tmp_path):
    from tuiapp.ui.commands import screen_actions

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen) and app.screen.loaded, what="home")
            titles = {a.title: a.key for a in screen_actions(app.screen, include_hidden=True)}
            assert titles["Evaluate"] == "E" and titles["Export"] == "X"

    asyncio.run(scenario())


def test_form_helpers(tmp_path):
    assert parse_limit("") == 0 and parse_limit(" 12 ") == 12
    (tmp_path / "eval.jsonl").write_text("{}\n")
    assert data_argument("eval.jsonl", tmp_path) == str(tmp_path / "eval.jsonl")
    assert data_argument("demo:facts-heldout", tmp_path) == "demo:facts-heldout"
    assert data_argument("org/dataset", tmp_path) == "org/dataset"  # as typed: the refusal names it
    text = files_text("/x", [f"f{i}" for i in range(10)])
    assert text.startswith("wrote 10 files to /x:") and text.endswith("… and 2 more")


def test_the_ui_process_never_imports_torch_for_evaluate_or_export():
    code = ("import sys; import tuiapp.ui.screens.evaluate, tuiapp.ui.screens.export, tuiapp.core.after.evaluation, "
            "tuiapp.core.after.exporting; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr
