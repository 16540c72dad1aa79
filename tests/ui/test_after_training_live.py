"""Evaluations and exports made from a shell while the app is open show up live (Pilot, real-run
fixtures): the history's eval column, the run view's status line and Samples pane, with a toast.
The files are written by core's own writers, as `llmtui eval` (core.run_folder.evals) and `llmtui export`
(core.after.exporting.record) write them."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from ui_fixtures import REAL_IDS, screen_text, test_app, wait_for

from tuiapp.core.after import exporting
from tuiapp.core.run_folder import evals
from tuiapp.core.store.runs import RunStore
from tuiapp.ui.after_training import AfterWatch, read
from tuiapp.ui.screens.home import HomeScreen
from tuiapp.ui.screens.run_view import RunViewScreen


def _eval_result(tuned: float, base: float) -> dict:
    return {"time": time.time(), "data": "demo:facts-heldout", "format": "alpaca", "records": 240,
            "target": {"label": "final", "kind": "full"},
            "models": {"tuned": {"loss": 0.52, "perplexity": tuned, "exact_match": 0.25, "rouge_l": 0.81},
                       "base": {"loss": 2.5, "perplexity": base, "exact_match": 0.0, "rouge_l": 0.1}}}


def _evaluate_from_a_shell(run_dir: Path, tuned: float, base: float) -> None:
    evals.write(evals.new_path(run_dir), _eval_result(tuned, base))


def _export_from_a_shell(run_dir: Path, out: Path) -> None:
    out.mkdir(parents=True)
    (out / "model.safetensors").write_bytes(b"x")
    request = exporting.ExportRequest(out=str(out), merge=True, dtype="bfloat16")
    planned = exporting.ExportPlan(run_dir.name, out, [], None, run_dir, request)
    exporting.record(planned, exporting.written(out))


@pytest.mark.slow  # a real eval process: ~4 s
def test_an_eval_from_a_shell_reaches_the_open_history_and_run_view(runs_root, tmp_path):
    run_id = REAL_IDS["sft"]
    run_dir = RunStore(runs_root).get(run_id).path

    async def scenario():
        app = test_app(runs_root, tmp_path, history_poll_s=0.2, poll_s=0.1)
        async with app.run_test(size=(160, 36)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen) and app.screen.summarized, 20,
                           what="history")
            home = app.screen
            assert home.model.rows[run_id].eval_ppl is None
            _evaluate_from_a_shell(run_dir, 1.68, 12.3)
            await wait_for(pilot, lambda: home.model.rows[run_id].eval_ppl == 1.68, 10, what="the eval column")
            assert home.model.rows[run_id].eval_base_ppl == 12.3
            for _ in range(12):  # the last column, by whole columns
                await pilot.press("right")
            assert "1.68 (base 12.3)" in screen_text(app)

            app.open_run(run_id)
            await wait_for(pilot, lambda: isinstance(app.screen, RunViewScreen) and app.screen.after is not None, 20,
                           what="run view")
            view = app.screen
            assert "eval ppl 1.68 (base 12.3)" in screen_text(app)
            _evaluate_from_a_shell(run_dir, 1.5, 12.3)  # a second eval while the view is open
            await wait_for(pilot, lambda: len(view.after.evals) == 2, 10, what="the second eval")
            await pilot.pause()
            text = screen_text(app)
            toasts = [n.message for n in app._notifications]
            assert "eval ppl 1.5 (base 12.3)" in text and "new evaluation: perplexity 1.5 (base 12.3)" in toasts
            _export_from_a_shell(run_dir, tmp_path / "exported")
            await wait_for(pilot, lambda: view.after.exports, 10, what="the export")
            await pilot.pause()
            text = screen_text(app)
            assert "1 export" in text
            assert f"exported to {(tmp_path / 'exported').resolve()}" in [n.message for n in app._notifications]
            await pilot.press("6")  # the Samples pane lists both, the latest first
            await pilot.pause()
            samples = str(view.query_one("#rv-samples").render())
            assert "evaluations (llmtui eval / E): 2" in samples and "perplexity 1.500 (base 12.300)" in samples
            assert f"{(tmp_path / 'exported').resolve()} (merged, bfloat16)" in samples
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is home, what="back home")
            await wait_for(pilot, lambda: home.model.rows[run_id].eval_ppl == 1.5, 10, what="the newer eval")

    asyncio.run(scenario())


def test_the_watch_reads_a_run_only_when_its_folders_change(tmp_path):
    run = tmp_path / "run-1"
    run.mkdir()
    watch = AfterWatch()
    assert watch.poll([("run-1", run)]) == {}  # nothing there: nothing read
    _evaluate_from_a_shell(run, 2.0, 9.0)
    found = watch.poll([("run-1", run)])
    assert found["run-1"].perplexity == (2.0, 9.0)
    assert watch.poll([("run-1", run)]) == {}  # unchanged: no read
    _export_from_a_shell(run, tmp_path / "out")
    assert len(watch.poll([("run-1", run)])["run-1"].exports) == 1
    assert read(run).exports[0]["files"] == 1
