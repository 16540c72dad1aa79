"""A running run whose loss and grad_norm are exactly 0 for ZERO_STEPS steps learns nothing (rewards all
NaN/None, say): flagged stalled in `llmtui show` and the run view's header, as a run whose steps stopped.
A real run folder whose supervisor lock this test holds (a live supervisor), its metrics as ranks write them."""

from __future__ import annotations

import time

from tuiapp.cli.main import main
from tuiapp.core.config.recipe import recipe_from_dict
from tuiapp.core.run_folder import runstate
from tuiapp.core.run_folder.metrics import JsonlWriter
from tuiapp.core.run_folder.rundata import read_run_data
from tuiapp.core.store.runs import Run, RunStore
from tuiapp.ui.run_panes import status_text

RECIPE = {"name": "flat", "model": {"name": "tiny"}, "method": {"kind": "grpo"}}


def running_run(tmp_path, losses):
    run = RunStore(tmp_path).create(recipe_from_dict(RECIPE), lock=True)  # held here: the supervisor lives
    now = time.time()
    run.update(status="running", started=now - 60, pid=None)
    with JsonlWriter(run.metrics_path) as rows:
        for step, loss in enumerate(losses, start=1):
            rows.write({"step": step, "max_steps": 100, "loss": loss, "grad_norm": loss, "time": now - 30 + step})
    return run


def test_zero_loss_and_grad_norm_for_k_steps_is_stalled_in_show_and_the_run_view(tmp_path, capsys):
    k = runstate.ZERO_STEPS
    run = running_run(tmp_path, [0.5, 0.25] + [0.0] * k)
    assert main(["--runs-dir", str(tmp_path), "show", run.id]) == 0
    out = capsys.readouterr().out
    assert "stalled" in out and f"loss and grad_norm exactly 0 for the last {k} steps" in out
    data, _ = read_run_data(run.metrics_path)
    header = status_text(Run(run.path).load().record, data, time.time())
    assert "stalled" in header and "learns nothing" in header


def test_fewer_zero_steps_or_a_step_that_learns_is_not_flagged(tmp_path, capsys):
    k = runstate.ZERO_STEPS
    run = running_run(tmp_path, [0.0] * (k - 1))
    assert main(["--runs-dir", str(tmp_path), "show", run.id]) == 0
    assert "stalled" not in capsys.readouterr().out
    assert runstate.zero_steps([{"step": 1, "loss": 0.0, "grad_norm": 0.0}, {"step": 2, "loss": 0.1, "grad_norm": 0.0}]) == 0
