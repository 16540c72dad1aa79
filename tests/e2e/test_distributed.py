"""2 CPU ranks through the real deepspeed launcher, with ZeRO-2 and ZeRO-3; export of the result."""

import json

import pytest

from tests.e2e.helpers import llmtui, metrics, only_run, run_info, train_steps

pytestmark = pytest.mark.slow


def test_two_ranks_zero2_full_sft(tmp_path):
    result = llmtui("run", "recipes/quickstart.toml", "--set", "train.max_steps=6", "--set", "train.eval_steps=3",
                    "--set", "train.save_steps=3", runs_dir=tmp_path)
    run_dir = only_run(tmp_path)
    assert result.returncode == 0, result.stdout + (run_dir / "stdout.log").read_text()[-4000:]
    info = run_info(run_dir)
    assert info["ranks"] == 2 and info["status"] == "succeeded"
    assert train_steps(run_dir) == [1, 2, 3, 4, 5, 6]
    row = [r for r in metrics(run_dir) if r.get("split", "train") == "train"][-1]
    assert set(row["mem"]) == {"rank0", "rank1"}
    evals = [r for r in metrics(run_dir) if r.get("split") == "eval"]
    assert [r["step"] for r in evals] == [3, 6] and len(evals[-1]["samples"]) == 2
    started = [json.loads(l) for l in (run_dir / "events.jsonl").read_text().splitlines() if '"started"' in l][0]
    assert started["world_size"] == 2
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["checkpoint-3", "checkpoint-6"]


def test_two_ranks_zero3_lora_then_export_merged(tmp_path):
    runs = tmp_path / "runs"
    result = llmtui("run", "recipes/tiny-lora.toml", "--set", "train.max_steps=5", "--set", "launch.gpus=2",
                    "--set", "launch.zero_stage=3", "--set", "train.save_steps=5", runs_dir=runs)
    run_dir = only_run(runs)
    assert result.returncode == 0, result.stdout + (run_dir / "stdout.log").read_text()[-4000:]
    assert run_info(run_dir)["ranks"] == 2

    adapter_out, merged_out = tmp_path / "adapter", tmp_path / "merged"
    exported = llmtui("export", run_dir.name, "--out", str(adapter_out), runs_dir=runs)
    assert exported.returncode == 0, exported.stderr
    assert (adapter_out / "adapter_config.json").exists()
    merged = llmtui("export", run_dir.name, "--out", str(merged_out), "--merge", runs_dir=runs)
    assert merged.returncode == 0, merged.stderr
    assert "Loading weights" not in merged.stderr and "it/s]" not in merged.stderr  # no library progress bars
    assert "Setting accelerator" not in merged.stdout + merged.stderr  # nor DeepSpeed's guess of one
    assert not (merged_out / "adapter_config.json").exists()

    import torch
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(merged_out)
    ids = tokenizer("What is the capital of France?", return_tensors="pt")
    with torch.no_grad():
        plain = AutoModelForCausalLM.from_pretrained(merged_out)(**ids).logits
        peft_logits = AutoPeftModelForCausalLM.from_pretrained(adapter_out)(**ids).logits
    assert torch.allclose(plain, peft_logits, atol=1e-4)
    again = llmtui("export", run_dir.name, "--out", str(merged_out), runs_dir=runs)
    assert again.returncode == 2 and "not empty" in again.stderr


def test_zero3_multi_turn_chat(tmp_path):
    result = llmtui("run", "recipes/tiny-chat-zero3.toml", "--set", "train.max_steps=5", runs_dir=tmp_path)
    run_dir = only_run(tmp_path)
    assert result.returncode == 0, result.stdout + (run_dir / "stdout.log").read_text()[-4000:]
    assert train_steps(run_dir) == [1, 2, 3, 4, 5]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run_dir / "final")
    assert sum(p.numel() for p in model.parameters()) > 1_000_000  # gathered, not ZeRO-3 shards
