"""dataset.streaming end to end (issue 26): a pretraining run on two CPU ranks reads its corpus while it
trains, and a run stopped and resumed trains on exactly the batches of an uninterrupted one (the same
tokens and the same loss at every step)."""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import llmtui, metrics, only_run, run_info, stop_after, wait_for
from tuiapp.core.data import demo_data

pytestmark = pytest.mark.slow

STEPS = 20  # the stop lands after step 5, the ranks paused until it is heard (stop_after)


def _corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    records = demo_data.text_records(4000)  # one pass of the stream holds every step's blocks
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _args(corpus, *extra):
    return ("run", "recipes/tiny-pretrain.toml", "--set", f'dataset.name="{corpus}"', "--set", "dataset.streaming=true",
            "--set", "dataset.eval_split=0", "--set", "train.eval_steps=0", "--set", f"train.max_steps={STEPS}",
            "--set", "train.save_steps=3", "--set", "train.logging_steps=1", "--set", "launch.gpus=2", *extra)


def _steps(run_dir) -> dict[int, tuple[float, float]]:
    """step -> (loss, tokens trained in that step)."""
    rows = [r for r in metrics(run_dir) if r.get("split", "train") == "train" and "loss" in r]
    out, before = {}, 0.0
    for row in rows:
        out[row["step"]] = (row["loss"], row["tokens"] - before)
        before = row["tokens"]
    return out


def test_a_stopped_and_resumed_stream_trains_on_the_uninterrupted_batches(tmp_path, runs_dir):
    corpus = _corpus(tmp_path)
    whole_dir, cut_dir = runs_dir / "whole", runs_dir / "cut"
    result = llmtui(*_args(corpus), runs_dir=whole_dir, timeout=900)
    whole = only_run(whole_dir)
    assert result.returncode == 0, result.stdout[-3000:] + (whole / "stdout.log").read_text()[-3000:]
    assert not list((tmp_path / "cache").glob("data/*")) if (tmp_path / "cache").exists() else True
    reference = _steps(whole)
    assert sorted(reference) == list(range(1, STEPS + 1))

    llmtui(*_args(corpus, "--detach"), runs_dir=cut_dir, check=True)
    cut = only_run(cut_dir)
    code, output = stop_after(cut, 5, cut_dir)
    assert code == 0, output
    wait_for(lambda: run_info(cut)["status"] == "stopped", what="stopped")
    stopped_at = max(_steps(cut))
    assert stopped_at < STEPS
    result = llmtui("resume", cut.name, runs_dir=cut_dir, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + (cut / "stdout.log").read_text()[-3000:]
    assert run_info(cut)["status"] == "succeeded"
    resumed = _steps(cut)
    assert sorted(resumed) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):  # the same batches: the same tokens, and (same weights) the same loss
        assert resumed[step][1] == reference[step][1], step
        assert resumed[step][0] == pytest.approx(reference[step][0], rel=1e-4, abs=1e-5), step
