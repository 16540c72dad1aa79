"""`llmtui merge` end to end (issue 31): two LoRA runs of the tiny model merged into a new run that
`llmtui eval` scores and chat answers from; two full-weight SFT runs merged with TIES on their changes
from the base; and what cannot be merged is refused before any work, leaving no run behind."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.after_runs import lora_run, sft_run
from tests.e2e.helpers import run_info, run_preset

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SHORT = ["--set", "train.max_steps=6", "--set", "train.eval_steps=0", "--set", "train.save_steps=0",
         "--set", "train.sample_prompts=[]", "--set", "dataset.eval_split=0"]


def llmtui(runs_dir: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(runs_dir), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def copied(runs_dir: Path, source: Path) -> str:
    """A finished run of the session (tests/after_runs.py) copied into this test's runs folder."""
    shutil.copytree(source, runs_dir / source.name)
    return source.name


def visible(runs_dir: Path) -> set[str]:
    return {p.name for p in runs_dir.iterdir()}


def test_two_lora_runs_merge_into_a_run_that_eval_and_chat_take(runs_dir, tmp_path_factory):
    a = copied(runs_dir, lora_run(tmp_path_factory))  # tiny-lora, 6 steps
    b = run_preset("recipes/tiny-lora.toml", runs_dir, "tiny-lora", *SHORT, "--set", "train.seed=2",
                   "--set", "train.learning_rate=5e-3").name
    done = llmtui(runs_dir, "merge", a, b, "--name", "facts-merged", "--weights", "0.7,0.3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert ".merging-" not in done.stdout + done.stderr  # the work folder, gone once the run exists, is not named
    merged = next(p for p in runs_dir.iterdir() if "facts-merged" in p.name)
    info = run_info(merged)
    assert info["status"] == "succeeded" and info["merged_from"] == [a, b] and info["method"] == "lora"
    assert info["merge"]["method"] == "linear" and info["merge"]["weights"] == [0.7, 0.3]
    final = json.loads((merged / "final" / "llmtui.json").read_text())
    assert final["merged_from"] == [a, b] and (merged / "final" / "adapter_config.json").exists()
    assert not any(p.name.startswith(".merging-") for p in runs_dir.iterdir())
    scored = llmtui(runs_dir, "eval", merged.name, "--data", "demo:facts-heldout", "--limit", "20", "--gen-limit", "3",
                    "--json")
    assert scored.returncode == 0, scored.stdout[-2000:] + scored.stderr[-2000:]
    models = json.loads(scored.stdout)["models"]
    assert models["tuned"]["perplexity"] < models["base"]["perplexity"]  # the merged adapter carries the training
    answer = llmtui(runs_dir, "chat", merged.name, "--prompt", "What is the capital of Japan?", "--json")
    assert answer.returncode == 0, answer.stderr[-2000:]
    document = json.loads(answer.stdout)
    assert document["target"]["label"] == "final" and document["answers"]["tuned"]["tokens"] > 0


def test_full_weight_runs_merge_with_ties_and_bad_merges_are_refused_before_any_work(runs_dir, tmp_path_factory):
    a = copied(runs_dir, sft_run(tmp_path_factory))  # tiny-sft, 60 steps
    b = run_preset("recipes/tiny-sft.toml", runs_dir, "tiny-sft", *SHORT, "--set", "train.seed=2").name
    lora = copied(runs_dir, lora_run(tmp_path_factory))
    before = visible(runs_dir)
    for args, words in (
        ([a, lora], ["cannot be merged", "LoRA adapters with each other"]),
        ([a, b, "--method", "cat"], ["--method cat", "use one of"]),
        ([a, b, "--weights", "1"], ["--weights has 1 values for 2 runs"]),
        ([a], ["two runs or more"]),
    ):
        refused = llmtui(runs_dir, "merge", *args, "--name", "bad")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert all(w in refused.stderr for w in words), refused.stderr
    assert visible(runs_dir) == before  # nothing half made
    done = llmtui(runs_dir, "merge", a, b, "--name", "sft-ties", "--method", "ties", "--density", "0.6")
    assert done.returncode == 0, done.stdout + done.stderr
    merged = next(p for p in runs_dir.iterdir() if "sft-ties" in p.name)
    assert run_info(merged)["merge"] == {"method": "ties", "weights": [0.5, 0.5], "density": 0.6}
    scored = llmtui(runs_dir, "eval", merged.name, "--data", "demo:facts-heldout", "--limit", "10", "--gen-limit", "0",
                    "--no-base", "--json")
    assert scored.returncode == 0, scored.stdout[-2000:] + scored.stderr[-2000:]
