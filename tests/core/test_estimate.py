"""Memory estimates: parameter counts against real models and peft, model states against the
ZeRO paper and DeepSpeed's own estimators."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuiapp.core.common.errors import RecipeError
from tuiapp.core.config.recipe import METHOD_KINDS, METHOD_MODELS, recipe_from_dict
from tuiapp.core.plan.estimate import (
    GB,
    PRESET_CONFIGS,
    TINY_CONFIG,
    activation_bytes,
    count_parameters,
    estimate_recipe,
    format_estimate,
    largest_layer_params,
    load_model_config,
    model_state_bytes,
    trainable_parameters,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def gb(n: float) -> float:
    return round(n / GB, 1)


def real_model(config: dict, meta: bool = True):
    hf_config = transformers.AutoConfig.for_model(**config)
    if meta:
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(hf_config)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(hf_config)


def real_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


SMALL = dict(vocab_size=1000, hidden_size=64, intermediate_size=176, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
CONFIGS = {
    "tiny": dict(TINY_CONFIG),
    "llama-gqa": dict(SMALL, model_type="llama"),
    "llama-untied-bias": dict(SMALL, model_type="llama", tie_word_embeddings=False,
                              attention_bias=True, mlp_bias=True, head_dim=32),
    "mistral": dict(SMALL, model_type="mistral"),
    "qwen2-tied": dict(SMALL, model_type="qwen2", tie_word_embeddings=True),
    "qwen2-untied": dict(SMALL, model_type="qwen2", tie_word_embeddings=False),
    "qwen3": dict(SMALL, model_type="qwen3", head_dim=24),
    "gpt2": dict(model_type="gpt2", vocab_size=1000, n_embd=64, n_layer=3, n_head=4, n_positions=128),
    "gpt2-inner": dict(model_type="gpt2", vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_inner=100),
    "gpt_neox": dict(model_type="gpt_neox", vocab_size=1000, hidden_size=64, intermediate_size=256,
                     num_hidden_layers=2, num_attention_heads=4),
    "mixtral": dict(SMALL, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2),
}


# ---------------------------------------------------------------- parameter counts


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_count_parameters_matches_real_model(name):
    config = CONFIGS[name]
    assert count_parameters(config) == real_count(real_model(config))


def test_count_parameters_from_transformers_config_dict():
    hf = transformers.LlamaConfig(**SMALL).to_dict()
    assert count_parameters(hf) == real_count(real_model(dict(SMALL, model_type="llama")))


@pytest.mark.parametrize("name", ["Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.2-1B",
                                  "TinyLlama/TinyLlama-1.1B-Chat-v1.0"])
def test_presets_match_real_models(name):
    config = PRESET_CONFIGS[name]
    assert count_parameters(config) == real_count(real_model(config))


@pytest.mark.parametrize("name,published", [
    ("Qwen/Qwen2.5-0.5B", 494_032_768), ("Qwen/Qwen2.5-1.5B", 1_543_714_304),
    ("Qwen/Qwen2.5-7B", 7_615_616_512), ("meta-llama/Llama-3.2-1B", 1_235_814_400),
    ("meta-llama/Llama-3.2-3B", 3_212_749_824), ("meta-llama/Llama-3.1-8B", 8_030_261_248),
    ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", 1_100_048_384),
])
def test_presets_have_published_sizes(name, published):
    assert count_parameters(PRESET_CONFIGS[name]) == published


def test_largest_layer_matches_deepspeed_definition():
    # DeepSpeed's estimate_zero3_model_states_mem_needs_all_live: params owned by one module
    for name in ("tiny", "gpt2", "qwen2-untied"):
        model = real_model(CONFIGS[name])
        largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
        assert largest_layer_params(CONFIGS[name]) == largest


# ---------------------------------------------------------------- trainable parameters vs peft


def _peft_trainable(config: dict, peft_config) -> int:
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(real_model(config, meta=False), peft_config)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _method(kind: str, **fields):
    return METHOD_MODELS[kind](**fields)


PEFT_CASES = [
    ("lora all-linear", "tiny", _method("lora", rank=8),
     lambda p: p.LoraConfig(r=8, target_modules="all-linear", task_type="CAUSAL_LM")),
    ("lora q,v gqa", "llama-gqa", _method("lora", rank=4, target_modules=["q_proj", "v_proj"]),
     lambda p: p.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")),
    ("lora gpt2 c_proj", "gpt2", _method("lora", rank=4, target_modules=["c_attn", "c_proj"]),
     lambda p: p.LoraConfig(r=4, target_modules=["c_attn", "c_proj"], task_type="CAUSAL_LM",
                            fan_in_fan_out=True)),
    ("dora", "llama-gqa", _method("dora", rank=4),
     lambda p: p.LoraConfig(r=4, target_modules="all-linear", use_dora=True, task_type="CAUSAL_LM")),
    ("prefix gqa", "llama-gqa", _method("prefix", virtual_tokens=8),
     lambda p: p.PrefixTuningConfig(num_virtual_tokens=8, task_type="CAUSAL_LM")),
    ("prefix projection", "llama-gqa", _method("prefix", virtual_tokens=8, projection=True, encoder_hidden_size=32),
     lambda p: p.PrefixTuningConfig(num_virtual_tokens=8, prefix_projection=True,
                                    encoder_hidden_size=32, task_type="CAUSAL_LM")),
    ("prompt", "tiny", _method("prompt", virtual_tokens=10),
     lambda p: p.PromptTuningConfig(num_virtual_tokens=10, task_type="CAUSAL_LM")),
    ("ptuning mlp", "tiny", _method("ptuning", virtual_tokens=10, encoder_hidden_size=48),
     lambda p: p.PromptEncoderConfig(num_virtual_tokens=10, encoder_hidden_size=48, task_type="CAUSAL_LM")),
    ("ptuning lstm", "tiny", _method("ptuning", virtual_tokens=10, encoder_type="LSTM", encoder_hidden_size=48),
     lambda p: p.PromptEncoderConfig(num_virtual_tokens=10, encoder_hidden_size=48,
                                     encoder_reparameterization_type="LSTM", task_type="CAUSAL_LM")),
    ("ia3 llama", "llama-gqa", _method("ia3"), lambda p: p.IA3Config(task_type="CAUSAL_LM")),
    ("ia3 qwen2", "qwen2-tied", _method("ia3"), lambda p: p.IA3Config(task_type="CAUSAL_LM")),
    ("ia3 gpt2", "gpt2", _method("ia3"), lambda p: p.IA3Config(task_type="CAUSAL_LM")),
    ("llama-adapter", "tiny", _method("llama-adapter", adapter_len=6, adapter_layers=2),
     lambda p: p.AdaptionPromptConfig(adapter_len=6, adapter_layers=2, task_type="CAUSAL_LM")),
]


@pytest.mark.parametrize("label,config_name,method,make", PEFT_CASES, ids=[c[0] for c in PEFT_CASES])
def test_trainable_parameters_match_peft(label, config_name, method, make):
    peft = pytest.importorskip("peft")
    config = CONFIGS[config_name]
    assert trainable_parameters(config, method) == _peft_trainable(config, make(peft))


def test_trainable_parameters_full_and_adapter_formula():
    total = count_parameters(TINY_CONFIG)
    assert trainable_parameters(TINY_CONFIG, "sft") == total
    assert trainable_parameters(TINY_CONFIG, "pretrain") == total
    assert trainable_parameters(TINY_CONFIG, "qlora") == trainable_parameters(TINY_CONFIG, "lora")
    # Houlsby bottleneck: down h*m+m, up m*h+h per block
    h, m, layers = 128, 64, 4
    assert trainable_parameters(TINY_CONFIG, "adapter") == layers * (h * m + m + m * h + h)
    pretrain = _method("pretrain", hidden_size=64, num_layers=2)
    assert trainable_parameters(TINY_CONFIG, pretrain) < total


def test_every_method_kind_has_a_count():
    for kind in METHOD_KINDS:
        assert 0 < trainable_parameters(TINY_CONFIG, kind) <= count_parameters(TINY_CONFIG)


# ---------------------------------------------------------------- model states


P = 7.5e9


@pytest.mark.parametrize("stage,expected", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_worked_example(stage, expected):
    # Rajbhandari et al. 2020, Figure 1: 7.5B parameters, N = 64, mixed-precision Adam (K = 12)
    states = model_state_bytes(P, P, stage, 64, precision="fp16")
    assert gb(states.total) == expected
    assert states.cpu_offload_total == 0


def test_fp32_costs_the_same_sixteen_bytes():
    states = model_state_bytes(1000, 1000, 0, 1, precision="fp32")
    assert (states.params, states.grads, states.optimizer) == (4000, 4000, 8000)


def test_frozen_weights_cost_only_their_weights():
    base, adapter = 1_000_000, 10_000
    states = model_state_bytes(base + adapter, adapter, 0, 1, precision="bf16")
    assert states.params == 2 * (base + adapter)
    assert states.grads == 2 * adapter
    assert states.optimizer == 12 * adapter
    sharded = model_state_bytes(base + adapter, adapter, 3, 4, precision="bf16")
    assert sharded.params == 2 * (base + adapter) // 4
    fp32 = model_state_bytes(base + adapter, adapter, 0, 1, precision="fp32")
    assert fp32.params == 4 * (base + adapter)


def _ds():
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    return estimate_zero2_model_states_mem_needs, estimate_zero3_model_states_mem_needs


@pytest.mark.parametrize("gpus,nodes", [(1, 1), (2, 1), (4, 1), (8, 2)])
def test_zero2_agrees_with_deepspeed(gpus, nodes):
    zero2, _ = _ds()
    total, world = 1_234_567_890, gpus * nodes
    # without offload DeepSpeed counts 2P + 18P/N: our 2P + 14P/N plus the fp32 grad partition
    _, ds_gpu = zero2(total, gpus, nodes, cpu_offload=False)
    paper = model_state_bytes(total, total, 2, world, precision="bf16")
    assert paper.total == 2 * total + int(14 * total / world)
    ours = model_state_bytes(total, total, 2, world, precision="bf16", gpus_per_node=gpus,
                             deepspeed_buffers=True)
    assert abs(ours.total - ds_gpu) <= 2
    # with offload only the 16-bit weights stay on GPU
    ds_cpu, ds_gpu = zero2(total, gpus, nodes, cpu_offload=True, additional_buffer_factor=1.0)
    ours = model_state_bytes(total, total, 2, world, "cpu", precision="bf16", gpus_per_node=gpus,
                             deepspeed_buffers=True)
    assert ours.total == ds_gpu
    if world <= 4 and nodes == 1:  # above that DeepSpeed's CPU figure is its 4P-per-rank init load
        assert abs(ours.cpu_offload_total - ds_cpu) <= 2


@pytest.mark.parametrize("gpus,nodes", [(1, 1), (4, 1), (8, 2)])
@pytest.mark.parametrize("offload_opt,offload_params", [(False, False), (True, False), (True, True)])
def test_zero3_agrees_with_deepspeed(gpus, nodes, offload_opt, offload_params):
    _, zero3 = _ds()
    total, largest, world = 987_654_321, 50_000_000, gpus * nodes
    ds_cpu, ds_gpu, _ = zero3(total, largest, gpus, nodes, cpu_offload=offload_opt,
                           cpu_offload_params=offload_params, zero_init=True,
                           additional_buffer_factor=1.0)
    ours = model_state_bytes(total, total, 3, world, "cpu" if offload_opt else "none",
                             "cpu" if offload_params else "none", precision="bf16",
                             gpus_per_node=gpus, largest_layer_params=largest,
                             deepspeed_buffers=True)
    assert abs(ours.total - ds_gpu) <= 4
    if offload_opt:  # without offload DeepSpeed's CPU figure is its zero.Init staging buffer
        assert abs(ours.cpu_offload_total - ds_cpu) <= 4 * gpus


# ---------------------------------------------------------------- activations and recipes


def _recipe(**sections):
    return recipe_from_dict({"method": {"kind": "lora"}, **sections})


def test_gradient_checkpointing_lowers_activations():
    shape = dict(seq_len=2048, micro_batch=4, hidden=4096, heads=32, layers=32, vocab=32000)
    plain = activation_bytes(checkpointing=False, **shape)
    checkpointed = activation_bytes(checkpointing=True, **shape)
    assert checkpointed < plain / 5
    # Korthikanti: s*b*h*(34 + 5*a*s/h) per layer when attention scores are stored
    s, b, h, a, layers = 2048, 4, 4096, 32, 32
    eager = activation_bytes(checkpointing=False, fused_attention=False, **shape)
    logits = s * b * 32000 * 12  # three fp32 copies at the loss's backward
    assert eager == layers * s * b * h * (34 + 5 * a * s // h) + logits
    recipe = _recipe(model={"name": "meta-llama/Llama-3.2-1B"}, method={"kind": "sft"})
    on = _recipe(model={"name": "meta-llama/Llama-3.2-1B"}, method={"kind": "sft"},
                 train={"gradient_checkpointing": True})
    config = PRESET_CONFIGS["meta-llama/Llama-3.2-1B"]
    assert estimate_recipe(on, config, 1).memory.activations < estimate_recipe(recipe, config, 1).memory.activations


def test_warning_when_it_does_not_fit():
    recipe = _recipe(model={"name": "meta-llama/Llama-3.1-8B"}, method={"kind": "sft"},
                     train={"max_seq_len": 2048, "micro_batch": 8})
    est = estimate_recipe(recipe, PRESET_CONFIGS["meta-llama/Llama-3.1-8B"], 8, gpu_memory_bytes=24 * 10**9)
    assert est.fits is False
    assert est.warning.startswith(f"needs {est.total / GB:.1f} GB per GPU, the GPU has 24.0 GB")
    assert "zero_stage=3" in est.warning
    assert est.suggestions
    assert "does NOT fit" in format_estimate(est)
    json.dumps(est.to_json())


def test_suggestions_are_ranked_by_what_helps():
    # LoRA on a small model with a long sequence: activations dominate, so checkpointing helps most
    recipe = _recipe(model={"name": "Qwen/Qwen2.5-0.5B"}, method={"kind": "lora"},
                     train={"max_seq_len": 8192, "micro_batch": 8})
    est = estimate_recipe(recipe, PRESET_CONFIGS["Qwen/Qwen2.5-0.5B"], 1, gpu_memory_bytes=24 * 10**9)
    assert est.fits is False
    assert est.suggestions[0].startswith("gradient_checkpointing=true") or est.suggestions[0].startswith("micro_batch")
    assert not any("zero_stage=3 (" in s for s in est.suggestions)  # sharding cannot help one GPU


def test_fits_and_unknown_gpu():
    recipe = _recipe(method={"kind": "lora"})
    est = estimate_recipe(recipe, TINY_CONFIG, 1, gpu_memory_bytes=80 * 10**9)
    assert est.fits is True and est.warning is None
    assert estimate_recipe(recipe, TINY_CONFIG, 1).fits is None
    table = format_estimate(est)
    assert "total" in table and "fits" in table
    assert estimate_recipe(recipe, TINY_CONFIG, 1, cuda=False).precision == "fp32"
    # a model this small is shown in MB: in GB every row read 0.0
    assert "per GPU          MB" in table and est.memory.total < GB
    assert row_gb(table, "total") == round(est.memory.total / 1e6, 1) > 0 and row_gb(table, "params") > 0


def test_qlora_base_is_about_half_a_byte_per_weight():
    config = PRESET_CONFIGS["meta-llama/Llama-3.1-8B"]
    lora = estimate_recipe(_recipe(method={"kind": "lora"}), config, 1)
    qlora = estimate_recipe(_recipe(method={"kind": "qlora"}), config, 1)
    assert 0.25 < qlora.memory.params / lora.memory.params < 0.4


def test_offload_reports_cpu_memory():
    recipe = _recipe(method={"kind": "sft"}, launch={"zero_stage": 2, "offload_optimizer": "cpu"})
    config = PRESET_CONFIGS["Qwen/Qwen2.5-1.5B"]
    est = estimate_recipe(recipe, config, 2)
    assert est.memory.optimizer == 0
    assert est.memory.cpu_offload_total == 16 * count_parameters(config)
    assert "CPU offload" in format_estimate(est)


# ---------------------------------------------------------------- configs


def test_load_model_config_sources(tmp_path):
    assert load_model_config("tiny") == TINY_CONFIG
    assert load_model_config("Qwen/Qwen2.5-0.5B")["hidden_size"] == 896
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIGS["gpt2"]))
    assert load_model_config(str(folder))["n_embd"] == 64
    assert load_model_config("my-model", base_dir=tmp_path)["n_embd"] == 64
    # the HF cache (read through huggingface_hub) wins over the preset table: test_model_check.py


def test_missing_config_names_the_key_and_fix():
    with pytest.raises(RecipeError) as info:
        load_model_config("nobody/unknown-model-xyz")
    assert info.value.key == "model.name"
    assert "download" in info.value.fix


def test_tiny_config_builds_a_llama():
    config = transformers.LlamaConfig(**TINY_CONFIG)
    assert real_count(real_model(dict(TINY_CONFIG))) == count_parameters(TINY_CONFIG)
    assert config.tie_word_embeddings is True


# ---------------------------------------------------------------- properties


method_strategy = st.sampled_from(METHOD_KINDS)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=method_strategy,
    stage=st.sampled_from([0, 1, 2, 3]),
    offload_opt=st.sampled_from(["none", "cpu", "nvme"]),
    offload_params=st.sampled_from(["none", "cpu"]),
    precision=st.sampled_from(["auto", "bf16", "fp16", "fp32"]),
    micro_batch=st.integers(1, 64),
    seq=st.integers(8, 32768),
    checkpointing=st.booleans(),
    gpus=st.integers(1, 16),
    nodes=st.integers(1, 4),
    hidden_heads=st.sampled_from([(64, 4), (128, 4), (896, 14), (4096, 32)]),
    layers=st.integers(1, 48),
    vocab=st.integers(2, 200_000),
    gpu_mem=st.one_of(st.none(), st.integers(1, 200 * 10**9)),
)
@pytest.mark.slow  # over ~1.5 s on 2 cores
def test_estimate_never_raises_and_is_monotone(kind, stage, offload_opt, offload_params, precision,
                                               micro_batch, seq, checkpointing, gpus, nodes,
                                               hidden_heads, layers, vocab, gpu_mem):
    hidden, heads = hidden_heads
    config = dict(model_type="llama", vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads)
    recipe = _recipe(method={"kind": kind},
                     train={"precision": precision, "micro_batch": micro_batch, "max_seq_len": seq,
                            "gradient_checkpointing": checkpointing},
                     launch={"zero_stage": stage, "offload_optimizer": offload_opt,
                             "offload_params": offload_params})
    est = estimate_recipe(recipe, config, gpus, nodes, gpu_mem)
    assert est.memory.total > 0
    assert (est.fits is None) == (not gpu_mem)
    assert (est.warning is None) == (est.fits is not False)
    format_estimate(est)
    json.dumps(est.to_json())
    if stage >= 1:
        more = estimate_recipe(recipe, config, gpus + 1, nodes, gpu_mem)
        assert more.memory.model_states <= est.memory.model_states


# ---------------------------------------------------------------- nodes x GPUs per node (`llmtui estimate`)


ZERO = {  # the ZeRO paper's model states per GPU (mixed-precision Adam), P params over N ranks
    0: lambda p, n: 16 * p,
    1: lambda p, n: 4 * p + 12 * p / n,
    2: lambda p, n: 2 * p + 14 * p / n,
    3: lambda p, n: 16 * p / n,
}
ZERO_TEXT = {0: "16P", 1: "4P + 12P/N", 2: "2P + 14P/N", 3: "16P/N"}
BIG = "Qwen/Qwen2.5-1.5B"  # an offline preset: the config needs no download


def cli_estimate(tmp_path: Path, recipe_text: str, *flags: str) -> tuple[dict, str]:
    """`llmtui estimate` in a real process with empty caches: (the JSON document, the text table)."""
    (tmp_path / "r.toml").write_text(recipe_text)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "LLMTUI_CACHE": str(tmp_path / "cache")}
    env.pop("HF_HUB_CACHE", None)
    outputs = []
    for extra in (["--json"], []):
        result = subprocess.run([sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(tmp_path / "runs"), "estimate",
                                 "r.toml", *flags, *extra], cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=120, stdin=subprocess.DEVNULL)
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout)
    return json.loads(outputs[0]), outputs[1]


def row_gb(text: str, name: str) -> float:
    [line] = [line for line in text.splitlines() if line.startswith(f"  {name} ")]
    return float(line[len(name) + 2:].split()[0])


@pytest.mark.slow  # over ~3.5 s on 2 busy cores (6.5-7.2 s each of 4 in the fast tier)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_estimate_uses_the_recipes_nodes_and_gpus_per_node(tmp_path, stage):
    recipe = (f'[model]\nname = "{BIG}"\n[method]\nkind = "sft"\n[train]\nprecision = "bf16"\n'
              f"[launch]\nnodes = 8\ngpus_per_node = 8\nzero_stage = {stage}\n")
    data, text = cli_estimate(tmp_path, recipe)
    p, n = count_parameters(PRESET_CONFIGS[BIG]), 64
    assert (data["nodes"], data["n_gpus"], data["world_size"]) == (8, 8, n)
    assert data["total_params"] == data["trainable_params"] == p
    mem = data["memory"]
    weights, grads, optimizer = {0: (2 * p, 2 * p, 12 * p), 1: (2 * p, 2 * p, 12 * p / n),
                                 2: (2 * p, 2 * p / n, 12 * p / n), 3: (2 * p / n, 2 * p / n, 12 * p / n)}[stage]
    assert (mem["params"], mem["grads"], mem["optimizer"]) == (int(weights), int(grads), int(optimizer))
    assert mem["model_states"] == mem["params"] + mem["grads"] + mem["optimizer"]
    assert abs(mem["model_states"] - ZERO[stage](p, n)) <= 3  # whole bytes per part
    # DeepSpeed's working buffers are modelled, and shown apart from the model states
    assert mem["buffers"] > 0
    assert mem["total"] == mem["model_states"] + mem["buffers"] + mem["activations"]
    assert "8 GPUs x 8 nodes (world size 64)" in text
    assert f"ZeRO-{stage}: {ZERO_TEXT[stage]}, N = 64" in text
    assert abs(row_gb(text, "model states") - ZERO[stage](p, n) / GB) <= 0.051
    assert abs(row_gb(text, "buffers") - mem["buffers"] / GB) <= 0.051
    assert abs(row_gb(text, "total") - mem["total"] / GB) <= 0.051


@pytest.mark.slow  # over ~5 s on 2 busy cores
def test_estimate_flags_override_the_recipe_and_hosts_count_their_slots(tmp_path):
    base = f'[model]\nname = "{BIG}"\n[method]\nkind = "sft"\n[train]\nprecision = "bf16"\n'
    data, text = cli_estimate(tmp_path, base + "[launch]\nnodes = 8\ngpus_per_node = 8\nzero_stage = 3\n",
                              "--nodes", "2", "--gpus", "4")
    assert (data["nodes"], data["n_gpus"], data["world_size"]) == (2, 4, 8)
    assert "4 GPUs x 2 nodes (world size 8)" in text
    # hosts mode: DeepSpeed's runner uses every slot of the listed hosts
    data, _ = cli_estimate(tmp_path, base + '[launch]\nhosts = ["a slots=4", "b slots=2"]\nzero_stage = 3\n')
    assert (data["nodes"], data["world_size"]) == (2, 6)
    p = count_parameters(PRESET_CONFIGS[BIG])
    assert abs(data["memory"]["model_states"] - ZERO[3](p, 6)) <= 3
    data, _ = cli_estimate(tmp_path, base + '[launch]\nhosts = ["a slots=4", "b slots=4", "c slots=4"]\n'
                           "nodes = 2\ngpus_per_node = 2\nzero_stage = 1\n")
    assert (data["nodes"], data["n_gpus"], data["world_size"]) == (2, 2, 4)
    # one machine: launch.gpus ranks
    data, _ = cli_estimate(tmp_path, base + "[launch]\ngpus = 3\nzero_stage = 2\n")
    assert (data["nodes"], data["n_gpus"], data["world_size"]) == (1, 3, 3)


def test_a_colocated_vllm_engine_takes_its_share_of_each_gpu():
    from tuiapp.core.config.recipe import load_recipe
    from tuiapp.core.plan.estimate import format_estimate

    recipe = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / "gpu-qwen-0.5b-grpo-lora.toml")
    config = PRESET_CONFIGS["Qwen/Qwen2.5-0.5B-Instruct"]
    on_gpu = estimate_recipe(recipe, config, 1, gpu_memory_bytes=80 * 10**9)
    assert on_gpu.generation_share == 0.3 and on_gpu.fits
    assert "+ vLLM" in format_estimate(on_gpu) and "(24.0 GB)" in format_estimate(on_gpu)
    # the training alone fits a small GPU, beside vLLM's 30 % it does not; the advice names the share
    need = on_gpu.memory.total
    small = int(need / 0.85)  # 0.9 usable without vLLM, 0.6 with it
    squeezed = estimate_recipe(recipe, config, 1, gpu_memory_bytes=small)
    assert not squeezed.fits and "beside vLLM" in squeezed.warning and "vllm_gpu_memory_utilization" in squeezed.warning
    plain = recipe.model_copy(update={"method": recipe.method.model_copy(update={"generation_backend": "transformers"})})
    assert estimate_recipe(plain, config, 1, gpu_memory_bytes=small).fits
    assert estimate_recipe(plain, config, 1).generation_share == 0.0


def test_the_setup_line_counts_ranks_once_and_says_cpu_ranks_without_cuda():
    from tuiapp.core.config.recipe import parse_recipe

    recipe = parse_recipe('[model]\nname = "tiny"\n[method]\nkind = "lora"\n[launch]\ngpus = 2\n')
    on_cpu = format_estimate(estimate_recipe(recipe, dict(TINY_CONFIG), 2, cuda=False))
    assert "setup        2 CPU ranks, ZeRO-" in on_cpu and "per rank" in on_cpu and "GPU" not in on_cpu
    on_gpu = format_estimate(estimate_recipe(recipe, dict(TINY_CONFIG), 1, cuda=True))
    assert "setup        1 GPU, ZeRO-" in on_gpu and "world size" not in on_gpu and "per GPU" in on_gpu
