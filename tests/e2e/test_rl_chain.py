"""The SFT -> reward model -> GRPO chain of presets (issue 27), end to end through `llmtui run` on CPU ranks:
each step names the one before with run:NAME, which is resolved to that run's final folder and frozen in
the step's recipe; the GRPO run's completions are scored by the reward model and the format reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.helpers import llmtui, metrics, run_info

pytestmark = pytest.mark.slow

SHORT = ("--set", "train.save_steps=0", "--set", "train.eval_steps=0")


def _run(preset: str, runs_dir: Path, *extra: str) -> Path:
    before = {p for p in runs_dir.iterdir()} if runs_dir.exists() else set()
    result = llmtui("run", f"recipes/{preset}.toml", *SHORT, *extra, runs_dir=runs_dir, timeout=900)
    run = next(p for p in runs_dir.iterdir() if p not in before and p.is_dir() and preset in p.name)
    log = (run / "stdout.log").read_text(errors="replace")[-3000:] if (run / "stdout.log").exists() else ""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + log
    assert run_info(run)["status"] == "succeeded"
    return run


def test_sft_then_a_reward_model_then_grpo_scored_by_it(runs_dir, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # many small generate calls: one thread per rank is faster here
    sft = _run("tiny-rl-chain-sft", runs_dir, "--set", "train.max_steps=6")
    reward = _run("tiny-rl-chain-reward", runs_dir, "--set", "train.max_steps=4")
    grpo = _run("tiny-rl-chain-grpo", runs_dir, "--set", "train.max_steps=3")
    assert Path(run_info(reward)["model"]) == sft / "final"  # run:tiny-rl-chain-sft, resolved
    assert Path(run_info(grpo)["model"]) == sft / "final"
    frozen = (grpo / "recipe.toml").read_text()
    assert "run:tiny-rl-chain-reward" not in frozen and str(reward / "final") in frozen
    done = [json.loads(line) for line in (grpo / "completions.jsonl").read_text().splitlines() if line.strip()]
    assert {d["step"] for d in done} == {1, 2, 3}
    assert all(set(d["rewards"]) == {"model", "format"} and isinstance(d["rewards"]["model"], float) for d in done)
    rows = [r for r in metrics(grpo) if r.get("split", "train") == "train"]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert {"rewards/model/mean", "rewards/format/mean"} <= set(rows[0])
