"""bench/gpu_check.py (`make gpu-check`): its no-CUDA branch, its recipes and figures, and its CPU smoke
(every stage that does not need CUDA, for real, at tiny sizes). The GPU branch itself: tests/e2e/test_gpu.py."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuiapp.core.config.recipe import load_recipe
from tuiapp.core.prelaunch import door
from tuiapp.core.store.runs import RunStore

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.py"
RESULTS = ROOT / "bench" / "GPU_RESULTS.md"


@pytest.fixture(scope="module")
def gpu_check():
    """The script as a module; bench/common.py rewrites a few variables of os.environ on import
    (its private caches), which must not leak into the other tests of the session."""
    saved = dict(os.environ)
    try:
        spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault("gpu_check", module)  # its dataclasses look their module up
        spec.loader.exec_module(module)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return module


def script(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def results_state():
    return RESULTS.read_bytes() if RESULTS.exists() else None


def test_without_cuda_it_says_nothing_ran_and_exits_0():
    before = results_state()
    done = script(env={"LLMTUI_FORCE_CPU": "1"})
    assert done.returncode == 0, done.stderr
    assert "nothing ran" in done.stdout and "CUDA" in done.stdout and "--cpu-smoke" in done.stdout
    assert "Traceback" not in done.stderr
    assert results_state() == before  # bench/GPU_RESULTS.md untouched


def test_an_unknown_stage_or_method_is_refused_with_exit_2():
    done = script("--stages", "methods,warp", "--methods", "sft,lorra", env={"LLMTUI_FORCE_CPU": "1"})
    assert done.returncode == 2
    assert "warp" in done.stderr and "lorra" in done.stderr and "fix:" in done.stderr
    assert "batching" in done.stderr  # the stage that runs only when named is offered too


def test_the_batching_stage_runs_only_when_named_and_fills_each_micro_batch(gpu_check, tmp_path):
    assert "batching" not in gpu_check.STAGES and "batching" in gpu_check.EXTRA_STAGE_BUDGET_S
    assert script("--stages", "mfu,batching", env={"LLMTUI_FORCE_CPU": "1"}).returncode == 0  # accepted
    import tomli_w

    p = gpu_check.GPU
    recipe = gpu_check.sft_recipe("x", Path("tiny"), tmp_path / "d.jsonl", p)
    recipe["train"].update(batching="tokens", tokens_per_batch=p.mfu_micro_batch * p.mfu_seq_len)
    (tmp_path / "r.toml").write_text(tomli_w.dumps(recipe))
    train = load_recipe(tmp_path / "r.toml").train  # what stage_batching writes is a valid recipe
    assert train.batching == "tokens" and train.packing is True


def test_every_method_of_the_schema_is_checked_from_its_preset(gpu_check, tmp_path):
    """A method added to the recipe schema is in the check by itself: each kind has a tiny-<kind> preset
    (qlora: tiny-lora's), and the recipe the check writes for it is valid."""
    import tomli_w

    kinds = gpu_check.method_kinds()
    assert {"pretrain", "sft", "lora", "qlora", "dpo", "kto", "reward"} <= set(kinds)
    for kind in kinds:
        data = gpu_check.method_recipe(kind, Path("tiny"), gpu_check.GPU)
        path = tmp_path / f"{kind}.toml"
        path.write_text(tomli_w.dumps(data))
        recipe = load_recipe(path)
        assert recipe.method.kind == kind
        assert recipe.train.max_steps == 20 and recipe.train.precision == "bf16" and recipe.launch.gpus == 1
        assert recipe.dataset.eval_split == 0.0 and recipe.train.eval_steps == 0
    qlora = load_recipe(tmp_path / "qlora.toml").method
    assert qlora.quant_type == "nf4" and qlora.double_quant
    # distill: a teacher a fresh GPU box has (the check's model itself), not the preset's earlier run
    distill = load_recipe(tmp_path / "distill.toml")
    assert not distill.method.teacher.startswith("run:") and distill.method.teacher == distill.model.name
    findings = door.recipe_findings(distill, RunStore(tmp_path / "runs"), base_dir=ROOT)
    assert not door.has_errors(findings), door.format_findings(findings)


def test_the_stage_recipes_are_valid(gpu_check, tmp_path):
    import tomli_w

    variants = {
        "eager": dict(attention="eager"), "flash": dict(attention="flash_attention_2"),
        "liger": dict(liger=True), "zero3": dict(zero=3, offload="cpu"), "zero2": dict(zero=2, offload="cpu"),
        "mfu": dict(steps=40, seq_len=2048, micro_batch=16),
    }
    for name, kwargs in variants.items():
        data = gpu_check.sft_recipe(f"x-{name}", Path("tiny"), tmp_path / "sft.jsonl", gpu_check.GPU, **kwargs)
        (tmp_path / f"{name}.toml").write_text(tomli_w.dumps(data))
        recipe = load_recipe(tmp_path / f"{name}.toml")
        assert recipe.train.packing is True and recipe.method.kind == "sft"
    assert load_recipe(tmp_path / "zero3.toml").launch.offload_optimizer == "cpu"
    assert load_recipe(tmp_path / "flash.toml").model.attn_implementation == "flash_attention_2"


def test_mfu_and_the_peak_of_known_gpus(gpu_check):
    assert gpu_check.peak_flops("NVIDIA H100 80GB HBM3") == 989.4e12
    assert gpu_check.peak_flops("NVIDIA H100 PCIe") == 756.5e12
    assert gpu_check.peak_flops("NVIDIA GH200 480GB") == 989.4e12
    assert gpu_check.peak_flops("NVIDIA L40S") == 362.05e12 and gpu_check.peak_flops("NVIDIA L4") == 121.0e12
    assert gpu_check.peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert gpu_check.peak_flops("Some Future GPU") is None
    # 1.1 B parameters at 60k tokens/s on an H100: 6 * 1.1e9 * 6e4 / 989.4e12 = 40 %
    assert math.isclose(gpu_check.mfu(6e4, 1_100_000_000, 989.4e12), 0.4002, rel_tol=1e-3)
    assert gpu_check.mfu(None, 10, 1e12) is None and gpu_check.mfu(1.0, 10, None) is None


def test_loss_parity_and_estimate_error(gpu_check):
    assert gpu_check.loss_gap([2.0, 1.0], [2.0, 1.01]) == pytest.approx(0.01 / 1.01)
    assert gpu_check.loss_gap([2.0, None], [2.02, 1.0]) == pytest.approx(0.02 / 2.02)
    assert gpu_check.loss_gap([], [1.0]) is None
    assert gpu_check.error_pct(110, 100) == pytest.approx(10.0)
    assert gpu_check.error_pct(None, 100) is None


@pytest.mark.slow
def test_cpu_smoke_runs_the_stages_for_real(tmp_path):
    """--cpu-smoke: two attention implementations (eager, torch_varlen's CPU fallback) on the same packed batches, the MFU stage with its
    plain-Trainer baseline, and the rl stage's preset chain (its base's final model the RL runs' model), through
    the real `llmtui run` and bench/baseline_train.py, 2-3 steps each."""
    before = results_state()
    out = tmp_path / "GPU_RESULTS.md"
    done = script("--cpu-smoke", "--stages", "attention,mfu,rl", "--out", str(out), "--work", str(tmp_path / "work"),
                  timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    report = out.read_text()
    assert "CPU smoke run" in report and "every check passed" in report
    for line in ("| attention | torch_varlen trains on packed batches | pass |",
                 "| attention | eager trains on packed batches | pass |",
                 "| attention | torch_varlen loss matches eager | pass |",
                 "| mfu | the plain Trainer baseline trains | pass |",
                 "| rl | tiny-grpo trains 2 steps | pass |", "| rl | tiny-rloo trains 2 steps | pass |"):
        assert line in report, report
    assert " (checks " in report and " · step " in report  # each run's start in its parts
    assert "### Profile of mfu-llmtui" in report and "| aten::mm |" in report  # train.profile_steps' table
    assert "flash_attention_2: needs CUDA" in report and "NVML readings: needs an NVIDIA GPU" in report
    assert "llmtui / plain Trainer: **" in report and "**—×**" not in report
    recipes = sorted(p.name for p in (tmp_path / "work" / "recipes").iterdir())
    assert recipes == ["attention-eager.toml", "attention-torch_varlen.toml", "mfu-llmtui.toml", "rl-format.toml",
                       "rl-grpo.toml", "rl-rloo.toml"]
    base = next(p for p in (tmp_path / "work" / "runs" / "rl-format").iterdir() if not p.name.startswith(".")) / "final"
    assert load_recipe(tmp_path / "work" / "recipes" / "rl-grpo.toml").model.name == str(base)
    assert "Stages, in the order they ran:" in report
    assert results_state() == before


def test_one_call_runs_the_stages_in_order_of_value_within_10_minutes(gpu_check):
    assert gpu_check.STAGES == ("mfu", "attention", "methods", "rl", "zero", "liger", "fp8", "probe")
    assert set(gpu_check.STAGE_BUDGET_S) == set(gpu_check.STAGES)
    # a device call's limit is 10 minutes: a minute of it for the wheels and building the models
    assert sum(gpu_check.STAGE_BUDGET_S.values()) <= 9 * 60


def test_methods_take_full_batches_and_rl_reward_is_judged_over_fifths(gpu_check, tmp_path):
    import tomli_w

    for kind in ("sft", "lora", "dpo", "grpo"):
        data = gpu_check.method_recipe(kind, Path("tiny"), gpu_check.GPU, data=tmp_path / "sft.jsonl")
        (tmp_path / f"{kind}.toml").write_text(tomli_w.dumps(data))
        recipe = load_recipe(tmp_path / f"{kind}.toml")
        full = kind in gpu_check.FULL_BATCH_KINDS
        assert (recipe.dataset.name == str(tmp_path / "sft.jsonl")) == full
        if full:
            assert recipe.train.packing is True and recipe.train.max_seq_len == gpu_check.GPU.seq_len
    assert gpu_check._fifths([0.1, 0.2, 0.3, 0.9, 0.1, 0.5, 0.6, 0.8, None, 0.9, 0.7]) == (
        pytest.approx(0.15), pytest.approx(0.8))
    assert gpu_check._fifths([0.5]) == (None, None)
    assert gpu_check._common_steps([1.0, 2.0], [1.0, 2.0, 3.0]) == ([1.0, 2.0], [1.0, 2.0])


def test_missing_optional_packages_without_wheels_are_reported_not_run(gpu_check, tmp_path):
    absent = [dist for module, dist in gpu_check.OPTIONAL.items() if not gpu_check.has_package(module)]
    reported = dict(gpu_check.install_wheels(tmp_path / "no-wheels"))
    assert sorted(reported) == sorted(absent)
    assert all("make gpu-wheels" in why for why in reported.values())


def test_the_attention_stage_recipes_take_the_new_kernels(gpu_check, tmp_path):
    import tomli_w

    for impl in ("torch_varlen", "flex_attention"):
        data = gpu_check.sft_recipe(f"x-{impl}", Path("tiny"), tmp_path / "sft.jsonl", gpu_check.GPU, attention=impl)
        (tmp_path / f"{impl}.toml").write_text(tomli_w.dumps(data))
        assert load_recipe(tmp_path / f"{impl}.toml").model.attn_implementation == impl
    fp8 = gpu_check.sft_recipe("x-fp8", Path("tiny"), tmp_path / "sft.jsonl", gpu_check.GPU)
    fp8["train"]["precision"] = "fp8"
    (tmp_path / "fp8.toml").write_text(tomli_w.dumps(fp8))
    assert load_recipe(tmp_path / "fp8.toml").train.precision == "fp8"


def test_stage_budgets_on_a_gpu_by_default_and_in_the_smoke_only_when_asked(gpu_check):
    total = sum(gpu_check.STAGE_BUDGET_S.values())
    assert gpu_check.stage_budget_scale(None, cpu_smoke=False) == 1.0
    assert gpu_check.stage_budget_scale(None, cpu_smoke=True) is None
    assert gpu_check.stage_budget_scale(total / 2, cpu_smoke=True) == 0.5
    assert gpu_check.stage_budget_scale(0, cpu_smoke=False) is None
    # --budget is shared among the stages named, in their budgets' proportions
    named = ("mfu", "batching")
    scale = gpu_check.stage_budget_scale(300, cpu_smoke=False, stages=named)
    budgets = {**gpu_check.STAGE_BUDGET_S, **gpu_check.EXTRA_STAGE_BUDGET_S}
    assert sum(budgets[stage] * scale for stage in named) == pytest.approx(300)
