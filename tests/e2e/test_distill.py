"""method 'distill' end to end: recipes/tiny-distill.toml through `llmtui run` (the real launcher, a
CPU rank, the bundled tiny-teacher's top-k logits cached before training, train and held-out); the
KL to the teacher goes down on both and the run ends succeeded with a final model."""

import json

import pytest

from tests.e2e.helpers import llmtui, metrics, only_run, run_info

pytestmark = pytest.mark.slow


def test_tiny_distill_run_learns_the_teacher(tmp_path):
    runs = tmp_path / "runs"
    result = llmtui("run", "recipes/tiny-distill.toml", runs_dir=runs, timeout=300)
    run_dir = only_run(runs)
    log = (run_dir / "stdout.log").read_text(errors="replace")[-3000:] if (run_dir / "stdout.log").exists() else ""
    assert result.returncode == 0 and run_info(run_dir)["status"] == "succeeded", result.stdout[-2000:] + log
    losses = [r["loss"] for r in metrics(run_dir) if r.get("split", "train") == "train" and "loss" in r]
    half = len(losses) // 2
    assert len(losses) >= 6 and sum(losses[half:]) / (len(losses) - half) < sum(losses[:half]) / half, losses
    assert min(losses[half:]) < losses[0] - 0.25, losses  # the KL to the teacher, per trained token
    evals = [r["eval_loss"] for r in metrics(run_dir) if r.get("split") == "eval"]  # held-out KL, steps 6 and 12
    assert len(evals) == 2 and evals[1] < evals[0], evals
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    distill = next(e for e in events if e.get("event") == "distill")
    assert distill["mode"] == "offline" and distill["top_k"] == 32 and "tiny-teacher" in distill["teacher"]
    info = json.loads((run_dir / "final" / "llmtui.json").read_text())
    assert info["method"] == "distill" and info["weights"] == "sft"
