"""train.precision = "fp8" (torchao's float8 training): refused before launch, with the fix, on a CPU,
without torchao, for methods that do not train the model's own linears and on GPUs older than Ada
and Hopper; the conversion of trainer/loop/fp8.py builds where torchao is installed."""

from __future__ import annotations

import importlib.util

import pytest

from tuiapp.core.config.recipe import recipe_from_dict
from tuiapp.core.machine.gpus import GpuInfo
from tuiapp.core.prelaunch.machine_rules import fp8_rules, machine_rules
from tuiapp.core.prelaunch.resources import check_gpus

H100 = 80 * 10**9


def recipe(kind="sft", precision="fp8"):
    return recipe_from_dict({"method": {"kind": kind}, "train": {"precision": precision}})


def gpu(index, name, capability):
    return GpuInfo(index, name, H100, 0, [], capability=capability)


def test_fp8_is_refused_on_a_cpu_with_the_fix():
    findings = machine_rules(recipe(), cuda=False)
    errors = [f for f in findings if f.key == "train.precision" and f.level == "error"]
    assert errors and "compute capability 8.9" in errors[0].message and "auto" in errors[0].fix


def test_fp8_needs_torchao_and_a_full_weight_method():
    missing = fp8_rules(recipe(), cuda=True, torchao_installed=False)
    assert missing and "torchao" in missing[0].message and "llmtui[fp8]" in missing[0].fix
    assert fp8_rules(recipe(), cuda=True, torchao_installed=True) == []
    assert fp8_rules(recipe("pretrain"), cuda=True, torchao_installed=True) == []
    lora = fp8_rules(recipe("lora"), cuda=True, torchao_installed=True)
    assert lora and lora[0].key == "train.precision" and "sft" in lora[0].fix
    assert fp8_rules(recipe(precision="bf16"), cuda=False) == []


def test_fp8_is_refused_on_gpus_without_fp8_tensor_cores():
    a100 = check_gpus(recipe(), [gpu(0, "NVIDIA A100-SXM4-80GB", (8, 0))])
    assert [f.key for f in a100 if f.level == "error"] == ["train.precision"]
    assert "A100" in a100[0].message and "bf16" in a100[0].fix
    assert not check_gpus(recipe(), [gpu(0, "NVIDIA H100", (9, 0))])
    assert not check_gpus(recipe(), [gpu(0, "NVIDIA L4", (8, 9))])
    assert not check_gpus(recipe(), [gpu(0, "unknown", None)])  # NVML could not tell: the rank decides
    assert not check_gpus(recipe(precision="bf16"), [gpu(0, "NVIDIA A100", (8, 0))])


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao (the fp8 extra) not installed")
def test_the_float8_conversion_builds_on_the_linears_but_the_head():
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from tuiapp.trainer.loop import fp8

    model = AutoModelForCausalLM.from_config(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                         num_attention_heads=4, vocab_size=320))
    assert fp8.convert(model) == 2 * 7  # q k v o, gate up down per layer
    assert type(model.model.layers[0].mlp.down_proj).__name__ == "Float8Linear"
    assert type(model.lm_head) is torch.nn.Linear
    if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9):  # the float8 forward
        model = model.to("cuda", torch.bfloat16)
        loss = model(input_ids=torch.randint(0, 320, (2, 32), device="cuda"), labels=None).logits.float().mean()
        loss.backward()
