"""`llmtui show` of a finished packed SFT run whose steps held little of their room: how full the median step
was, from its own metrics, and the setting that fills it (train.batching = "tokens"); nothing of it once the
run's recorded batching is "tokens". The run is the session's finished tiny SFT run (tests/after_runs.py)."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.after_runs import sft_run
from tests.e2e.helpers import llmtui
from tuiapp.core.run_folder.metrics import dedupe_steps, read_jsonl, train_rows

pytestmark = pytest.mark.slow


def test_show_tells_a_packed_run_of_its_empty_room(tmp_path_factory, tmp_path):
    source = sft_run(tmp_path_factory)
    run = tmp_path / source.name
    shutil.copytree(source, run)
    recipe = json.loads((run / "run.json").read_text())["recipe"]["train"]
    rows = [r for r in dedupe_steps(train_rows(read_jsonl(run / "metrics.jsonl"))) if "tokens" in r]
    per_step = sorted((b["tokens"] - a["tokens"]) / (b["step"] - a["step"]) for a, b in zip(rows, rows[1:], strict=False))
    fill = per_step[len(per_step) // 2] / (recipe["micro_batch"] * recipe["max_seq_len"] * recipe["grad_accum"])
    assert fill < 0.6, fill  # demo:facts' records are short: most of each 8 x 128 step is empty

    shown = llmtui("show", run.name, runs_dir=tmp_path, check=True).stdout
    assert f"steps held {fill:.0%} of their room ({recipe['micro_batch']} x {recipe['max_seq_len']} tokens" in shown
    assert 'train.batching = "tokens" fills each micro batch' in shown

    record = json.loads((run / "run.json").read_text())
    record["recipe"]["train"]["batching"] = "tokens"
    (run / "run.json").write_text(json.dumps(record))
    shown = llmtui("show", run.name, runs_dir=tmp_path, check=True).stdout
    assert "tokens (1024 per micro batch)" in shown and "steps held" not in shown
