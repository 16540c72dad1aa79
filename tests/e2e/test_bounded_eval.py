"""Bounded evaluation, through the real CLI, rank and Trainer: the evaluation after the last step
reads at most train.eval_max_samples examples and shows its progress (`eval N/M`), and
train.eval_steps = 0 means no evaluation at all."""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import llmtui, metrics, only_run, run_info

pytestmark = pytest.mark.slow

SETTINGS = ["--set", "train.max_steps=2", "--set", "train.save_steps=0", "--set", "train.micro_batch=4",
            "--set", "train.max_seq_len=32", "--set", "dataset.eval_split=0.3", "--set", "launch.gpus=1"]


def events(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


def test_the_last_evaluation_obeys_the_cap_and_shows_progress(tmp_path):
    # demo:text at max_seq_len 32 holds out far more than 24 blocks; the eval reads 24, in 6 batches of 4
    result = llmtui("run", "recipes/tiny-pretrain.toml", *SETTINGS, "--set", "train.eval_steps=50",
                    "--set", "train.eval_max_samples=24", runs_dir=tmp_path / "capped")
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = only_run(tmp_path / "capped")
    progress = [e for e in events(run_dir) if e["event"] == "eval_progress"]
    assert progress and all(e["total"] == 24 and e["step"] == 2 for e in progress), progress
    assert progress[0]["done"] == 4 and progress[-1]["done"] == 24
    assert [r["step"] for r in metrics(run_dir) if r.get("split") == "eval"] == [2]
    assert "eval 24/24  step 2" in result.stdout and "eval step 2: loss" in result.stdout


def test_eval_steps_zero_turns_evaluation_off(tmp_path):
    result = llmtui("run", "recipes/tiny-pretrain.toml", *SETTINGS, "--set", "train.eval_steps=0",
                    runs_dir=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = only_run(tmp_path)
    assert run_info(run_dir)["status"] == "succeeded"
    assert not [r for r in metrics(run_dir) if r.get("split") == "eval"]
    assert not [e for e in events(run_dir) if e["event"] in ("eval", "eval_progress")]
    assert "eval " not in result.stdout
