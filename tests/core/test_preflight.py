"""Preflight rules, one by one, on this machine and on described ones."""

from __future__ import annotations

import pytest

from tuiapp.core.common.errors import RecipeError
from tuiapp.core.common.findings import Finding, format_findings, has_errors
from tuiapp.core.config.recipe import recipe_from_dict
from tuiapp.core.machine.gpus import GpuInfo, GpuProcess, cuda_available, detect_gpus
from tuiapp.core.plan.estimate import GB, PRESET_CONFIGS, TINY_CONFIG
from tuiapp.core.prelaunch import door
from tuiapp.core.prelaunch.machine_rules import machine_rules
from tuiapp.core.prelaunch.recipe_rules import check_method, recipe_rules
from tuiapp.core.prelaunch.resources import (
    check_disk,
    check_gpus,
    check_memory,
    disk_needed_bytes,
    launch_world,
    memory_estimate,
)
from tuiapp.core.store.runs import RunStore

H100 = 80 * 10**9


def check_rules(recipe, *, cuda, bnb_installed=None):
    """The recipe's rules and this machine's software rules together."""
    return recipe_rules(recipe) + machine_rules(recipe, cuda=cuda, bnb_installed=bnb_installed)


def recipe(**sections):
    return recipe_from_dict({"method": {"kind": "lora"}, **sections})


def keys(findings, level="error"):
    return [f.key for f in findings if f.level == level]


def gpu(index, total=H100, others=()):
    return GpuInfo(index, "NVIDIA H100", total, sum(p.used_bytes for p in others), list(others))


# ---------------------------------------------------------------- rules


def test_default_recipe_passes_on_cpu():
    assert check_rules(recipe(), cuda=False, bnb_installed=False) == []


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_without_cuda_is_an_error(precision):
    findings = check_rules(recipe(train={"precision": precision}), cuda=False)
    assert keys(findings) == ["train.precision"]
    assert findings[0].fix == "set train.precision = 'fp32' or 'auto'"
    assert check_rules(recipe(train={"precision": precision}), cuda=True) == []
    assert check_rules(recipe(train={"precision": "auto"}), cuda=False) == []


def machine(r, tmp_path, **given):
    """The door's machine phase, with what `given` names in place of this machine's."""
    return door.machine_findings(r, RunStore(tmp_path / "runs"), tmp_path, **given)


def test_qlora_needs_cuda_and_bitsandbytes(tmp_path):
    qlora = recipe(method={"kind": "qlora"})
    no_cuda = check_rules(qlora, cuda=False, bnb_installed=True)
    assert keys(no_cuda) == ["method.kind"] and "CUDA" in no_cuda[0].message
    no_bnb = check_rules(qlora, cuda=True, bnb_installed=False)
    assert keys(no_bnb) == ["method.kind"] and "bitsandbytes" in no_bnb[0].message
    assert check_rules(qlora, cuda=True, bnb_installed=True) == []
    # on this machine (no CUDA, no bitsandbytes) it can only fail
    assert has_errors(machine(qlora, tmp_path, model_config=TINY_CONFIG, gpus=[], free_bytes=10**12))


def test_zero3_with_qlora_is_an_error():
    findings = check_rules(recipe(method={"kind": "qlora"}, launch={"zero_stage": 3}),
                           cuda=True, bnb_installed=True)
    assert keys(findings) == ["launch.zero_stage"]


def test_prefix_with_gradient_checkpointing_is_an_error():
    findings = check_rules(recipe(method={"kind": "prefix"}, train={"gradient_checkpointing": True}),
                           cuda=False)
    assert keys(findings) == ["train.gradient_checkpointing"]
    assert check_rules(recipe(method={"kind": "prompt"}, train={"gradient_checkpointing": True}),
                       cuda=False) == []


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_offload_params_needs_zero3(stage):
    findings = check_rules(recipe(launch={"zero_stage": stage, "offload_params": "cpu",
                                          "offload_optimizer": "cpu"}), cuda=True)
    assert "launch.offload_params" in keys(findings)
    assert check_rules(recipe(launch={"zero_stage": 3, "offload_params": "cpu",
                                      "offload_optimizer": "cpu"}), cuda=True) == []


def test_recipe_rules_need_no_machine():
    # what `llmtui validate` can say anywhere; machine rules are separate
    bad = recipe(method={"kind": "prefix"}, train={"gradient_checkpointing": True, "precision": "bf16"})
    assert keys(recipe_rules(bad)) == ["train.gradient_checkpointing"]
    assert keys(machine_rules(bad, cuda=False)) == ["train.precision"]


def test_offload_optimizer_needs_zero():
    findings = check_rules(recipe(launch={"zero_stage": 0, "offload_optimizer": "cpu"}), cuda=True)
    assert keys(findings) == ["launch.offload_optimizer"]


def test_nvme_offload_needs_an_existing_path(tmp_path):
    launch = {"zero_stage": 3, "offload_optimizer": "nvme"}
    assert keys(check_rules(recipe(launch=launch), cuda=True)) == ["launch.nvme_path"]
    missing = dict(launch, nvme_path=str(tmp_path / "nope"))
    assert keys(check_rules(recipe(launch=missing), cuda=True)) == ["launch.nvme_path"]
    assert check_rules(recipe(launch=dict(launch, nvme_path=str(tmp_path))), cuda=True) == []


def test_lora_targets_must_exist():
    bad = recipe(method={"kind": "lora", "target_modules": ["c_attn"]})
    assert keys(check_method(bad, TINY_CONFIG)) == ["method.target_modules"]
    good = recipe(method={"kind": "lora", "target_modules": ["q_proj", "v_proj"]})
    assert check_method(good, TINY_CONFIG) == []


# ---------------------------------------------------------------- GPUs


def test_gpu_count_and_ids_must_exist():
    gpus = [gpu(0), gpu(1)]
    assert keys(check_gpus(recipe(launch={"gpus": 4}), gpus)) == ["launch.gpus"]
    findings = check_gpus(recipe(launch={"gpus": [1, 5]}), gpus)
    assert keys(findings) == ["launch.gpus"] and "[5]" in findings[0].message
    assert check_gpus(recipe(launch={"gpus": 2}), gpus) == []
    assert check_gpus(recipe(launch={"gpus": "all"}), gpus) == []


def test_busy_gpu_is_a_warning_naming_free_ones():
    gpus = [gpu(0, others=[GpuProcess(4242, 10 * 10**9)]), gpu(1)]
    findings = check_gpus(recipe(launch={"gpus": [0]}), gpus)
    assert keys(findings, "warning") == ["launch.gpus"]
    assert "4242" in findings[0].message and "[1]" in findings[0].fix
    assert check_gpus(recipe(launch={"gpus": [1]}), gpus) == []


def test_force_cpu_env(monkeypatch):
    monkeypatch.setenv("LLMTUI_FORCE_CPU", "1")
    assert cuda_available([gpu(0)]) is False
    monkeypatch.delenv("LLMTUI_FORCE_CPU")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert cuda_available([gpu(0)]) is True


# ---------------------------------------------------------------- memory


def test_memory_that_does_not_fit_is_a_warning_and_far_beyond_an_error():
    big = recipe(method={"kind": "sft"}, train={"max_seq_len": 2048, "micro_batch": 8},
                 launch={"gpus": 1})
    config = PRESET_CONFIGS["meta-llama/Llama-3.1-8B"]  # about 255 GB
    findings = check_memory(big, config, cuda=True, gpus=[gpu(0, total=160 * 10**9)])
    assert [f.level for f in findings] == ["warning"]
    assert "needs" in findings[0].message and findings[0].fix.startswith("try ")
    far = check_memory(big, config, cuda=True, gpus=[gpu(0, total=24 * 10**9)])  # over 2x: an error
    assert [f.level for f in far] == ["error"] and "--oversubscribe" in far[0].fix
    ok = check_memory(recipe(method={"kind": "lora"}), TINY_CONFIG, cuda=True, gpus=[gpu(0)])
    assert [f.level for f in ok] == ["info"]


def test_memory_held_by_others_counts_against_capacity():
    lora = recipe(model={"name": "Qwen/Qwen2.5-1.5B"}, method={"kind": "lora"}, launch={"gpus": 1})
    config = PRESET_CONFIGS["Qwen/Qwen2.5-1.5B"]
    assert check_memory(lora, config, cuda=True, gpus=[gpu(0)])[0].level == "info"
    crowded = gpu(0, others=[GpuProcess(7, 70 * 10**9)])  # 10 GB left of 80
    assert check_memory(lora, config, cuda=True, gpus=[crowded])[0].level == "warning"
    full = gpu(0, others=[GpuProcess(7, 78 * 10**9)])  # 2 GB left: over 2x short
    assert check_memory(lora, config, cuda=True, gpus=[full])[0].level == "error"


def test_cpu_ranks_against_ram():
    two = recipe(method={"kind": "sft"}, launch={"gpus": 2})
    assert check_memory(two, TINY_CONFIG, cuda=False, gpus=[], ram_available=10**12)[0].level == "info"
    assert check_memory(two, TINY_CONFIG, cuda=False, gpus=[], ram_available=12 * 10**8)[0].level == "warning"
    assert check_memory(two, TINY_CONFIG, cuda=False, gpus=[], ram_available=10**6)[0].level == "error"


def test_preflight_and_the_estimate_see_the_same_world(tmp_path):
    """Preflight's memory check, `llmtui estimate` and the TUI form's estimate: one world, one number."""
    sft = recipe(model={"name": "Qwen/Qwen2.5-1.5B"}, method={"kind": "sft"}, train={"precision": "bf16"},
                 launch={"nodes": 8, "gpus_per_node": 8, "zero_stage": 3})
    config = PRESET_CONFIGS["Qwen/Qwen2.5-1.5B"]
    gpus = [gpu(i) for i in range(8)]
    est = memory_estimate(sft, config, gpus=gpus, cuda=True)
    assert (est.nodes, est.n_gpus, est.world_size) == (8, 8, 64)
    [finding] = check_memory(sft, config, cuda=True, gpus=gpus)
    assert f"about {est.total / GB:.1f} GB per GPU" in finding.message and "64 ranks on 8 nodes" in finding.message
    report = door.estimate_report(sft, RunStore(tmp_path / "runs"), tmp_path)  # this machine: no GPU
    assert report["json"]["world_size"] == 64
    assert report["json"]["memory"]["model_states"] == est.memory.model_states


def test_launch_world_follows_the_launch(tmp_path):
    cases = [
        ({}, (1, 1, 1)),  # CPU, gpus = 'all': one rank
        ({"gpus": 4}, (1, 4, 4)),
        ({"nodes": 3, "gpus": 2}, (3, 2, 6)),  # node by node: each node runs launch.gpus ranks
        ({"nodes": 2, "gpus_per_node": 8, "strategy": "fsdp"}, (2, 8, 16)),
        ({"hosts": ["a slots=8", "b slots=4"]}, (2, 8, 12)),
        ({"hosts": ["a slots=8", "b slots=8"], "exclude": "b"}, (1, 8, 8)),
        ({"hosts": "hostfile", "nodes": 2}, (2, 2, 4)),  # relative to base_dir
    ]
    (tmp_path / "hostfile").write_text("w0 slots=2\nw1 slots=2\nw2 slots=2\n")
    for launch, expected in cases:
        world = launch_world(recipe(launch=launch), [], cuda=False, base_dir=tmp_path)
        assert (world.nodes, world.per_node, world.size) == expected, launch
    assert launch_world(recipe(launch={"gpus": "all"}), [gpu(0), gpu(1)], cuda=True).size == 2
    over = launch_world(recipe(launch={"nodes": 8, "gpus_per_node": 8}), [], cuda=False, nodes=2, per_node=4)
    assert (over.nodes, over.per_node, over.size) == (2, 4, 8)
    (tmp_path / "bad-hosts").write_text("w0\n")
    with pytest.raises(RecipeError) as info:
        launch_world(recipe(launch={"hosts": "bad-hosts"}), [], cuda=False, base_dir=tmp_path)
    assert info.value.key == "launch.hosts" and info.value.line == 1


# ---------------------------------------------------------------- disk


def test_disk_check_takes_free_bytes():
    sft = recipe(method={"kind": "sft"}, train={"save_total_limit": 2, "precision": "bf16"})
    config = PRESET_CONFIGS["Qwen/Qwen2.5-0.5B"]
    need = disk_needed_bytes(sft, config, cuda=True)
    assert need == 3 * 494_032_768 * (2 + 12)  # 3 checkpoints of bf16 weights + Adam states
    assert keys(check_disk(sft, config, need - 1, cuda=True)) == ["train.save_total_limit"]
    assert keys(check_disk(sft, config, need + 1, cuda=True), "warning") == ["train.save_total_limit"]
    assert check_disk(sft, config, 2 * need, cuda=True) == []


def test_adapters_need_little_disk():
    lora = recipe(method={"kind": "lora"})
    sft = recipe(method={"kind": "sft"})
    config = PRESET_CONFIGS["Qwen/Qwen2.5-0.5B"]
    assert disk_needed_bytes(lora, config, cuda=True) * 20 < disk_needed_bytes(sft, config, cuda=True)


# ---------------------------------------------------------------- together


def test_the_machine_phase_on_this_machine(tmp_path):
    findings = machine(recipe(method={"kind": "lora"}), tmp_path, model_config=TINY_CONFIG)
    assert not has_errors(findings)
    text = format_findings(findings)
    assert text.splitlines()[-1] == "preflight: ok"
    bad = machine(recipe(train={"precision": "bf16"}), tmp_path, model_config=TINY_CONFIG,
                  gpus=[], cuda=False, free_bytes=1)
    assert keys(bad) == ["train.precision", "train.save_total_limit"]
    text = format_findings(bad)
    assert text.startswith("error    train.precision:")
    assert "fix: set train.precision" in text
    assert text.splitlines()[-1] == "preflight: 2 errors"


def test_the_machine_phase_without_config_or_with_an_odd_one(tmp_path):
    assert not has_errors(machine(recipe(), tmp_path, model_config=None, gpus=[], cuda=False))
    odd = machine(recipe(), tmp_path, model_config={"model_type": "t5"}, gpus=[], cuda=False, free_bytes=10**12)
    assert [f.level for f in odd if "cannot estimate" in f.message] == ["warning"]


def test_finding_is_plain_data():
    f = Finding("warning", "launch.gpus", "busy", "use GPU 1")
    assert (f.level, f.key, f.message, f.fix) == ("warning", "launch.gpus", "busy", "use GPU 1")


# ---------------------------------------------------------------- GPU machines only


def _nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _nvml_works(), reason="needs an NVIDIA GPU with NVML")
def test_detect_gpus_on_a_cuda_machine():
    gpus = detect_gpus()
    assert gpus and [g.index for g in gpus] == list(range(len(gpus)))
    assert all(g.total_bytes > GB and 0 <= g.used_bytes <= g.total_bytes and g.name for g in gpus)
    assert cuda_available(gpus) or __import__("os").environ.get("LLMTUI_FORCE_CPU") == "1"


def test_detect_gpus_without_nvml_is_empty():
    if _nvml_works():
        pytest.skip("this machine has NVML")
    assert detect_gpus() == []


def test_eval_on_start_needs_evals_to_be_read_against():
    alone = recipe(train={"eval_on_start": True})
    assert keys(recipe_rules(alone)) == ["train.eval_on_start"]
    finding = next(f for f in recipe_rules(alone) if f.key == "train.eval_on_start")
    assert "train.eval_steps > 0" in finding.fix
    assert keys(recipe_rules(recipe(train={"eval_on_start": True, "eval_steps": 10}))) == []
