"""Pipeline parallelism through the real DeepSpeed launcher on CPU ranks: the loss curve of a
pipeline run against the same recipe without the pipeline, stop -> resume, export of the stages.

Tolerance of the loss comparison: both runs are fp32 on CPU with the same weights at start (same
seed), the same batches in the same order (the Trainer's seeded sampler) and the same loss
normalisation (HF's: summed over the step's label tokens, divided by their count, which the
pipeline applies to each micro-batch before the micro-batch losses are added). What remains is
the order of floating-point sums (micro-batches of 2 rows against one batch of 8, gradients
accumulated over micro-batches, the grad norm summed over stages): about 1e-7 relative per step,
carried along a few Adam steps. rel=1e-4 leaves room for that and still fails a wrong
normalisation: on SFT, whose micro-batches hold different numbers of answer tokens, the mean of the
micro-batch means differs from the token mean by more than 1e-3 within the first steps.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.helpers import ROOT, kill_runs, llmtui, metrics, only_run, run_info, stop_after, train_steps

pytestmark = pytest.mark.slow

SFT_STEPS = ["--set", "train.max_steps=20", "--set", "train.eval_steps=20", "--set", "train.save_steps=10",
             "--set", "train.sample_max_new_tokens=12"]


def train_rows(run_dir):
    return [r for r in metrics(run_dir) if r.get("split", "train") == "train"]


def assert_same_curve(pipeline_dir, plain_dir, rel=1e-4):
    piped, plain = train_rows(pipeline_dir), train_rows(plain_dir)
    assert [r["step"] for r in piped] == [r["step"] for r in plain]
    for a, b in zip(piped, plain, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=rel), (a["step"], a["loss"], b["loss"])
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3), a["step"]
        assert a["lr"] == pytest.approx(b["lr"], rel=1e-9, abs=1e-12) and a["tokens"] == b["tokens"]


def run_ok(recipe, *overrides, runs_dir):
    result = llmtui("run", recipe, *overrides, runs_dir=runs_dir, timeout=900)
    run_dir = only_run(runs_dir)
    assert result.returncode == 0, result.stdout + (run_dir / "stdout.log").read_text()[-4000:]
    return run_dir


@pytest.fixture(scope="module")
def sft_runs(tmp_path_factory):
    """The SFT preset with the pipeline (2 ranks, 2 stages, 4 micro-batches, GPipe) and the same
    recipe on 1 rank without it (micro_batch 8 = the pipeline's whole step)."""
    root = tmp_path_factory.mktemp("pipeline-sft")
    try:
        piped = run_ok("recipes/tiny-pipeline-sft.toml", *SFT_STEPS, runs_dir=root / "pipeline")
        plain = run_ok("recipes/tiny-sft.toml", *SFT_STEPS, runs_dir=root / "plain")
        yield piped, plain
    finally:
        for sub in ("pipeline", "plain"):
            if (root / sub).is_dir():
                kill_runs(root / sub)


def test_sft_pipeline_matches_the_run_without_it(sft_runs):
    piped, plain = sft_runs
    info = run_info(piped)
    assert info["status"] == "succeeded" and info["ranks"] == 2
    assert_same_curve(piped, plain)
    evals = [r for r in metrics(piped) if r.get("split") == "eval"]
    plain_evals = [r for r in metrics(plain) if r.get("split") == "eval"]
    assert [r["step"] for r in evals] == [20]
    # the Trainer averages eval batches by rows, the pipeline by tokens: close, not equal
    assert evals[0]["eval_loss"] == pytest.approx(plain_evals[0]["eval_loss"], rel=2e-3)
    assert evals[0]["samples"][0]["prompt"] == "What is the capital of Japan?"
    row = train_rows(piped)[-1]
    assert set(row["mem"]) == {"rank0", "rank1"} and row["tokens_per_s"] > 0
    events = [json.loads(line) for line in (piped / "events.jsonl").read_text().splitlines()]
    started = next(e for e in events if e["event"] == "started")
    assert started["world_size"] == 2 and started["params"] == started["trainable_params"] > 1_000_000
    pipeline = next(e for e in events if e["event"] == "pipeline")
    assert pipeline["stages"] == 2 and pipeline["schedule"] == "gpipe" and pipeline["microbatches"] == 4
    assert pipeline["split"][0][:2] == [0, 2] and pipeline["split"][1][:2] == [2, 4]
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [10, 20]
    last = piped / "checkpoints" / "checkpoint-20"
    assert sorted(p.name for p in last.glob("stage-*")) == ["stage-0", "stage-1"]
    assert (last / "trainer_state.json").is_file()


def test_export_loads_with_transformers_and_answers_like_the_last_eval(sft_runs, tmp_path):
    piped, _ = sft_runs
    runs_dir, out, merged = piped.parent, tmp_path / "export", tmp_path / "merged"
    exported = llmtui("export", piped.name, "--out", str(out), runs_dir=runs_dir)
    assert exported.returncode == 0, exported.stderr
    # the stage checkpoints of the last step, merged by the export tool itself
    result = subprocess.run([sys.executable, "-m", "tuiapp.trainer.tools.publish", str(piped / "checkpoints/checkpoint-20"),
                             "--out", str(merged)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "merged 2 pipeline stages" in result.stdout, result.stderr

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sample = [r for r in metrics(piped) if r.get("split") == "eval"][-1]["samples"][0]
    tokenizer = AutoTokenizer.from_pretrained(out)
    text = tokenizer.apply_chat_template([{"role": "user", "content": sample["prompt"]}], tokenize=False,
                                         add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    answers, logits = [], []
    for folder in (out, merged):
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        with torch.no_grad():
            logits.append(model(**ids).logits)
            generated = model.generate(**ids, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        answers.append(tokenizer.decode(generated[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip())
    assert answers == [sample["output"], sample["output"]]
    assert torch.equal(logits[0], logits[1])  # final/ and the merged stages are the same weights


def test_stop_then_resume_continues_the_same_curve(sft_runs, runs_dir):
    reference, _ = sft_runs
    long = [*SFT_STEPS, "--set", "train.save_steps=0"]
    llmtui("run", "recipes/tiny-pipeline-sft.toml", *long, "--detach", runs_dir=runs_dir, check=True)
    run_dir = only_run(runs_dir)
    code, output = stop_after(run_dir, 3, runs_dir)
    assert code == 0, output
    assert run_info(run_dir)["status"] == "stopped"
    [checkpoint] = list((run_dir / "checkpoints").glob("checkpoint-*"))
    at = int(checkpoint.name.split("-")[1])
    assert 3 <= at < 20 and sorted(p.name for p in checkpoint.glob("stage-*")) == ["stage-0", "stage-1"]
    events = (run_dir / "events.jsonl").read_text()
    assert '"stop_checkpoint"' in events

    resumed = llmtui("resume", run_dir.name, runs_dir=runs_dir, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + (run_dir / "stdout.log").read_text()[-3000:]
    assert run_info(run_dir)["status"] == "succeeded"
    assert train_steps(run_dir) == list(range(1, 21))  # no gap, no step twice
    starts = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()
              if '"started"' in line]
    assert [s["step"] for s in starts] == [0, at]
    assert_same_curve(run_dir, reference, rel=1e-5)  # the uninterrupted pipeline run, step by step


def test_pretrain_pipeline_matches_the_run_without_it(runs_dir):
    """Over an epoch's end: a few documents make a few blocks, the last batch of the epoch is short
    (padded rows without labels in the pipeline), and the next epoch reshuffles with seed + 1."""
    steps = ["--set", "train.max_steps=5", "--set", "train.eval_steps=0", "--set", "train.save_steps=0",
             "--set", "dataset.max_samples=100"]
    piped = run_ok("recipes/tiny-pipeline-pretrain.toml", *steps, runs_dir=runs_dir / "pipeline")
    plain = run_ok("recipes/tiny-pretrain.toml", *steps, runs_dir=runs_dir / "plain")
    assert_same_curve(piped, plain)
    assert train_rows(piped)[-1]["epoch"] > 1
    assert (piped / "final" / "config.json").is_file()


def test_two_pipelines_in_data_parallel_match_two_plain_ranks(runs_dir):
    """4 ranks: 2 stages x 2 replicas, against DeepSpeed ZeRO-0 on 2 ranks (the same batches per rank)."""
    steps = ["--set", "train.max_steps=3", "--set", "train.eval_steps=0", "--set", "train.save_steps=0"]
    piped = run_ok("recipes/tiny-pipeline-pretrain.toml", *steps, "--set", "launch.gpus=4",
                   "--oversubscribe", runs_dir=runs_dir / "pipeline")  # 4 CPU ranks on fewer cores
    plain = run_ok("recipes/tiny-pretrain.toml", *steps, "--set", "launch.gpus=2", runs_dir=runs_dir / "plain")
    assert run_info(piped)["ranks"] == 4
    assert_same_curve(piped, plain)
    assert set(train_rows(piped)[-1]["mem"]) == {"rank0", "rank1", "rank2", "rank3"}


def cuda_count() -> int:
    from tuiapp.core.plan.launcher import cuda_device_count

    return cuda_device_count()


@pytest.mark.skipif(cuda_count() == 0, reason="needs a CUDA GPU")
def test_pipeline_trains_on_gpus_in_bf16(runs_dir):
    """NCCL between the stages, bf16 autocast over fp32 master weights: 2 stages on 2 GPUs, or one
    stage on a machine with one GPU."""
    stages = 2 if cuda_count() >= 2 else 1
    run_dir = run_ok("recipes/tiny-pipeline-pretrain.toml", "--set", "train.max_steps=6", "--set",
                     "train.eval_steps=0", "--set", "train.save_steps=3", "--set", "train.precision='bf16'",
                     "--set", f"launch.gpus={stages}", "--set", f"launch.pipeline_stages={stages}",
                     runs_dir=runs_dir)
    rows = train_rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 7)) and rows[-1]["loss"] < rows[0]["loss"]
    assert all(m["device"].startswith("cuda") for m in rows[-1]["mem"].values())
    assert sorted(p.name for p in (run_dir / "checkpoints/checkpoint-6").glob("stage-*")) == \
        [f"stage-{k}" for k in range(stages)]
