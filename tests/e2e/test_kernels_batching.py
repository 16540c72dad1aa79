"""Token-budget batches on a real run (CPU), and the kernel switches on a real run (CUDA only: these
skip without it)."""

import importlib.util
import json
import math

import pytest
import torch

from tests.e2e.helpers import llmtui, metrics, only_run, run_info

pytestmark = pytest.mark.slow
BUDGET = 512
QUICK = ("--set", "train.eval_steps=0", "--set", "train.save_steps=0", "--set", "dataset.eval_split=0",
         "--set", "train.sample_prompts=[]")


def _train_rows(run_dir):
    return [r for r in metrics(run_dir) if r.get("split", "train") == "train"]


def test_token_batches_fill_each_step_to_the_budget_and_train(runs_dir):
    result = llmtui("run", "recipes/tiny-lora.toml", "--set", "train.max_steps=12", *QUICK,
                    "--set", "train.batching=tokens", "--set", f"train.tokens_per_batch={BUDGET}", runs_dir=runs_dir)
    run_dir = only_run(runs_dir)
    assert result.returncode == 0, result.stdout + (run_dir / "stdout.log").read_text()[-4000:]
    rows = _train_rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 13))
    per_step = [b["tokens"] - a["tokens"] for a, b in zip([{"tokens": 0}, *rows], rows, strict=False)]
    # greedy filling stops when the next example does not fit: within one example (< 128 tokens) of it
    assert all(BUDGET - 128 < n <= BUDGET for n in per_step), per_step
    first, last = sum(r["loss"] for r in rows[:3]) / 3, sum(r["loss"] for r in rows[-3:]) / 3
    assert last < first - 0.2, [r["loss"] for r in rows]
    listed = json.loads(llmtui("runs", "--json", runs_dir=runs_dir, check=True).stdout)
    assert listed[0]["batching"] == f"tokens ({BUDGET} per micro batch)"
    shown = llmtui("show", run_dir.name, runs_dir=runs_dir, check=True).stdout
    assert f"batching  tokens ({BUDGET} per micro batch)" in shown


def _gpu_run(runs_dir, *sets: str):
    result = llmtui("run", "recipes/tiny-lora.toml", "--set", "train.max_steps=6", *QUICK,
                    "--set", "train.precision=bf16", *sets, runs_dir=runs_dir)
    run_dir = only_run(runs_dir)
    assert result.returncode == 0, result.stdout + (run_dir / "stdout.log").read_text()[-4000:]
    assert run_info(run_dir)["status"] == "succeeded"
    losses = [r["loss"] for r in _train_rows(run_dir)]
    assert len(losses) == 6 and all(math.isfinite(v) for v in losses)
    return run_dir


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None, reason="needs liger-kernel")
def test_liger_kernel_run_on_cuda(runs_dir):
    _gpu_run(runs_dir, "--set", "train.liger_kernel=true")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="needs flash_attn")
def test_flash_attention_packed_run_on_cuda(runs_dir):
    _gpu_run(runs_dir, "--set", "model.attn_implementation=flash_attention_2", "--set", "train.batching=tokens")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_torch_compile_run_on_cuda(runs_dir):
    _gpu_run(runs_dir, "--set", "train.torch_compile=true")
