"""Every method trains 5 steps through the real deepspeed launcher on CPU, with checkpoints and a
final model or adapter that loads."""

import json
from pathlib import Path

import pytest

from tests.e2e.helpers import llmtui, metrics, only_run, run_info, train_steps

pytestmark = pytest.mark.slow

CPU_METHODS = ["pretrain", "sft", "lora", "dora", "prefix", "prompt", "ptuning", "ia3", "adapter", "llama-adapter"]
SHORT = ["--set", "train.max_steps=5", "--set", "train.save_steps=5", "--set", "train.eval_steps=5",
         "--set", "train.logging_steps=1"]


def load_final(final: Path, method: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(final)
    info = json.loads((final / "llmtui.json").read_text())
    if method in ("pretrain", "sft"):
        model = AutoModelForCausalLM.from_pretrained(final)
    elif method == "adapter":
        from tuiapp.trainer.models.bottleneck import load_bottleneck

        model = load_bottleneck(AutoModelForCausalLM.from_pretrained(info["base_model"]), final)
    else:
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(final)
    ids = tokenizer("What is the capital of France?", return_tensors="pt")
    with torch.no_grad():
        out = model(**ids)
    assert torch.isfinite(out.logits).all()
    return model


@pytest.mark.parametrize("method", CPU_METHODS)
def test_method_trains_and_saves(method, tmp_path):
    result = llmtui("run", f"recipes/tiny-{method}.toml", *SHORT, runs_dir=tmp_path)
    run_dir = only_run(tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + (run_dir / "stdout.log").read_text()[-4000:]
    assert "step 5/5" in result.stdout
    assert run_info(run_dir)["status"] == "succeeded"
    assert train_steps(run_dir) == [1, 2, 3, 4, 5]
    rows = metrics(run_dir)
    assert all(isinstance(r["loss"], float) for r in rows if r.get("split", "train") == "train")
    assert any(r.get("split") == "eval" for r in rows)
    assert (run_dir / "checkpoints" / "checkpoint-5" / "trainer_state.json").is_file()
    if method in ("lora", "dora"):  # their dropout modules draw from the fast generator
        rank0 = next((run_dir / "ranks").glob("*rank0.log")).read_text()
        assert "module(s) draw their masks from numpy's SFC64" in rank0
    load_final(run_dir / "final", method)
