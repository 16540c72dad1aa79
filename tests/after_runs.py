"""Real runs for the after-training tests (chat, eval, trackers, export), trained once per test
session through the real CLI, launcher, DeepSpeed (1 CPU rank) and Trainer, and shared by
tests/e2e/test_after_training.py and tests/ui/test_chat.py. Each test copies what it changes."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_made: dict[str, Path] = {}


def trackers_here() -> list[str]:
    """tensorboard (the test extra) and whichever of wandb / mlflow is installed."""
    found = ["tensorboard"]
    found += [name for name, module in (("wandb", "wandb"), ("mlflow", "mlflow")) if importlib.util.find_spec(module)]
    return found


def _train(root: Path, recipe: str, sets: list[str]) -> Path:
    argv = [sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(root), "run", recipe]
    for item in sets:
        argv += ["--set", item]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    runs = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    if done.returncode != 0 or len(runs) != 1:
        raise AssertionError(f"training {recipe} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return runs[0]


def sft_run(tmp_path_factory) -> Path:
    """Full fine-tune of the tiny model on demo:facts, 60 steps, checkpoints 30 and 60, an eval at the
    end, reporting to the trackers installed here (offline, into the run folder)."""
    if "sft" not in _made:
        root = tmp_path_factory.mktemp("after-sft")
        _made["sft"] = _train(root, "recipes/tiny-sft.toml", [
            "train.max_steps=60", "train.save_steps=30", "train.eval_steps=0", "train.logging_steps=2",
            f"train.report_to={json.dumps(trackers_here())}"])
    return _made["sft"]


def lora_run(tmp_path_factory) -> Path:
    """A LoRA adapter on the tiny model (its final/ is an adapter, chatted with on its base)."""
    if "lora" not in _made:
        root = tmp_path_factory.mktemp("after-lora")
        _made["lora"] = _train(root, "recipes/tiny-lora.toml", [
            "train.max_steps=6", "train.save_steps=0", "train.eval_steps=0"])
    return _made["lora"]


def lora_run_b(tmp_path_factory) -> Path:
    """A second LoRA adapter on the tiny model, as lora_run but another seed: the same base, other
    answers (`llmtui serve` of several adapters on one base)."""
    if "lora-b" not in _made:
        root = tmp_path_factory.mktemp("after-lora-b")
        _made["lora-b"] = _train(root, "recipes/tiny-lora.toml", [
            "train.max_steps=6", "train.save_steps=0", "train.eval_steps=0", "train.seed=1", "name=tiny-lora-b"])
    return _made["lora-b"]


VLM_STEPS, VLM_LR = 200, 5e-3  # demo:shapes learned on CPU: 35% held-out exact match (400 steps: 34%), the base 0%


def vlm_run(tmp_path_factory) -> Path:
    """LoRA on the tiny VLM (Gemma 3 family) over demo:shapes, long enough to learn the answers
    (the chat-with-an-image and image-QA eval tests)."""
    if "vlm" not in _made:
        root = tmp_path_factory.mktemp("after-vlm")
        _made["vlm"] = _train(root, "recipes/tiny-vlm-lora.toml", [
            f"train.max_steps={VLM_STEPS}", f"train.learning_rate={VLM_LR}", "train.save_steps=0",
            "train.eval_steps=0", "train.seed=0"])
    return _made["vlm"]


BENCH_STEPS, BENCH_EVERY, BENCH_LIMIT = 8, 4, 12


def bench_run(tmp_path_factory) -> Path:
    """recipes/tiny-sft-bench.toml made short: 8 steps, an evaluation (with the demo benchmark,
    12 questions) at steps 4 and 8, checkpoints 4 and 8. Shared by the benchmark and judge tests."""
    if "bench" not in _made:
        root = tmp_path_factory.mktemp("after-bench")
        _made["bench"] = _train(root, "recipes/tiny-sft-bench.toml", [
            f"train.max_steps={BENCH_STEPS}", f"train.eval_steps={BENCH_EVERY}", f"train.save_steps={BENCH_EVERY}",
            f"eval.benchmarks.0.limit={BENCH_LIMIT}"])
    return _made["bench"]


JUDGE_STEPS, JUDGE_LR = 20, 5e-3  # enough for the tiny model to answer every pair with the bare verdict "A"


def verdict_judge_run(tmp_path_factory) -> Path:
    """A tiny judge that always prefers answer A: SFT on judge requests (the pairwise rubric, a question
    of the demo facts and two answers, either one the right one) whose answer is "A". As the judge of a
    pairwise run, its verdicts are all valid and, with the answers swapping places every other prompt,
    half of them are wins: the win rate's arithmetic is tested on a real served judge."""
    if "judge" not in _made:
        import random

        from tuiapp.core.after.judging import PAIRWISE_RUBRIC, pair_text
        from tuiapp.core.data.demo_data import facts_eval_pairs

        root = tmp_path_factory.mktemp("after-judge")
        pairs, rng = facts_eval_pairs(), random.Random(0)
        data = root / "verdicts.jsonl"
        with data.open("w", encoding="utf-8") as out:
            for index in range(96):
                question, right = pairs[index % len(pairs)]
                wrong = pairs[rng.randrange(len(pairs))][1]
                first, second = (right, wrong) if index % 2 == 0 else (wrong, right)
                out.write(json.dumps({"messages": [
                    {"role": "system", "content": PAIRWISE_RUBRIC},
                    {"role": "user", "content": pair_text(question, first, second)},
                    {"role": "assistant", "content": "A"}]}) + "\n")
        runs = root / "runs"
        runs.mkdir()
        _made["judge"] = _train(runs, "recipes/tiny-sft.toml", [
            f"dataset.name={data}", "dataset.eval_split=0", f"train.max_steps={JUDGE_STEPS}",
            f"train.learning_rate={JUDGE_LR}", "train.eval_steps=0", "train.save_steps=0", "train.max_seq_len=384",
            "train.sample_prompts=[]", "name=judge"])
    return _made["judge"]
