"""Evaluate and Export of a real trained run from the app (slow: torch in child processes): E on
the history runs the evaluation beside the UI, shows the table `llmtui eval` prints and where it
was saved, and the history's eval column picks it up; esc cancels a running evaluation; X exports
the adapter merged and cast, and lists the files written. The run is tests/after_runs.py's LoRA."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from textual.widgets import Checkbox, Input, Select, Static
from ui_fixtures import screen_text, test_app, wait_for

from tests.after_runs import lora_run
from tuiapp.core.run_folder import evals, exports
from tuiapp.ui.screens.evaluate import EvaluateScreen
from tuiapp.ui.screens.export import ExportScreen
from tuiapp.ui.screens.home import HomeScreen
from tuiapp.ui.widgets.runs_table import RunsTable

pytestmark = pytest.mark.slow
TOOL_S = 300.0  # torch + transformers import, two tiny models, on a busy 2-core box


@pytest.fixture
def runs_root(tmp_path_factory, tmp_path) -> tuple[Path, str]:
    run = lora_run(tmp_path_factory)
    root = tmp_path / "runs"
    shutil.copytree(run, root / run.name)
    return root, run.name


def _text(screen, selector: str) -> str:
    return str(screen.query_one(selector, Static).render())


async def _home(pilot, run_id: str) -> HomeScreen:
    app = pilot.app
    await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen) and app.screen.summarized, what="home")
    app.screen.query_one(RunsTable).move_to_id(run_id)
    await pilot.pause()
    return app.screen


def test_evaluate_from_the_history_shows_the_scores_and_fills_the_eval_column(runs_root, tmp_path):
    root, run_id = runs_root

    async def scenario():
        app = test_app(root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            home = await _home(pilot, run_id)
            assert home.model.rows[run_id].eval_ppl is None
            await pilot.press("E")
            await wait_for(pilot, lambda: isinstance(app.screen, EvaluateScreen), what="the form")
            form = app.screen
            form.query_one("#eval-limit", Input).value = "8"
            await pilot.press("enter")  # in the data field: runs
            await wait_for(pilot, lambda: form.running and "running" in _text(form, "#tool-progress"), what="running")
            assert "on demo:facts-heldout (" in form.last_line  # what `llmtui eval` says it evaluates
            await wait_for(pilot, lambda: not form.running, TOOL_S, what="the evaluation")
            assert _text(form, "#tool-error") == "", _text(form, "#tool-error")
            result = _text(form, "#tool-result")
            saved = evals.latest(root / run_id)
            assert saved is not None and saved["records"] == 8
            assert evals.table(saved)[0] in result  # the table `llmtui eval` prints
            for label in ("loss", "perplexity", "ROUGE-L", "base"):
                assert label in result
            assert f"saved {saved['path']}" in result
            # inside the 80x24 frame, once the result's layout has been painted
            await wait_for(pilot, lambda: "perplexity" in screen_text(app), what="the scores on screen")
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen), what="back home")
            row = home.model.rows[run_id]
            assert row.eval_ppl == pytest.approx(evals.number(saved, "tuned", "perplexity"))
            assert row.eval_base_ppl == pytest.approx(evals.number(saved, "base", "perplexity"))

            await pilot.press("E")  # again, cancelled while it loads
            await wait_for(pilot, lambda: isinstance(app.screen, EvaluateScreen), what="the form again")
            form = app.screen
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: form._child is not None and form._child._proc is not None, 60,
                           what="the child process")
            proc = form._child._proc
            await pilot.press("escape")
            await wait_for(pilot, lambda: not form.running, 60, what="the cancel")
            assert "cancelled" in _text(form, "#tool-error")
            assert proc.poll() is not None
            assert len(evals.results(root / run_id)) == 1

    asyncio.run(scenario())


def test_export_from_the_history_merges_casts_and_lists_the_files(runs_root, tmp_path):
    root, run_id = runs_root
    out = tmp_path / "exported"

    async def scenario():
        app = test_app(root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await _home(pilot, run_id)
            await pilot.press("X")
            await wait_for(pilot, lambda: isinstance(app.screen, ExportScreen), what="the form")
            form = app.screen
            form.query_one("#export-out", Input).value = str(out)
            form.query_one("#export-dtype", Select).value = "bfloat16"
            form.query_one("#export-merge", Checkbox).value = True
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: form.running, what="running")
            await wait_for(pilot, lambda: not form.running, TOOL_S, what="the export")
            assert _text(form, "#tool-error") == "", _text(form, "#tool-error")
            result = _text(form, "#tool-result")
            assert f"to {out}:" in result and "config.json" in result
            assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
            assert not (out / "adapter_config.json").exists()  # merged: a full model
            (record,) = exports.made(root / run_id)  # the run view lists it
            assert record["out"] == str(out.resolve()) and record["merged"] and record["dtype"] == "bfloat16"
            # the merge's parity ran on the float32 merge: the report says so, the files are bfloat16
            (parity,) = json.loads((out / "export.json").read_text())["parity"]
            assert parity["exported"] == f"merged {out.name}/ (transformers, float32 before the cast to bfloat16)"

    asyncio.run(scenario())
