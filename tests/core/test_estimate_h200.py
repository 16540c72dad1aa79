"""The memory estimate against peaks measured on an NVIDIA H200 (torch's max_memory_allocated; torch 2.11,
transformers 5.23, TRL 1.16, DeepSpeed 0.19.8, liger-kernel 0.8.5, bf16, one GPU, no ZeRO), and the
per-layer tensor count it scales against the tensors a real transformers layer saves."""

from __future__ import annotations

import copy

import pytest

from tuiapp.core.config.recipe import recipe_from_dict
from tuiapp.core.plan.estimate import (
    PRESET_CONFIGS,
    activation_bytes,
    estimate_recipe,
    format_estimate,
    generation_bytes,
    layer_values,
    liger_kept,
    model_shape,
)

GIB = 2**30
QWEN = PRESET_CONFIGS["Qwen/Qwen2.5-0.5B"]  # hidden 896, intermediate 4864, 24 layers, 14/2 heads, tied
# the ~1.1 B llama shape of the measurement: TinyLlama's with 16 heads (head_dim 128), 4 KV heads, untied
LLAMA_1B = dict(PRESET_CONFIGS["TinyLlama/TinyLlama-1.1B-Chat-v1.0"], num_attention_heads=16)

GRPO = {
    "model": {"name": "Qwen/Qwen2.5-0.5B"},
    "dataset": {"name": "demo:digits", "eval_split": 0.0},
    "method": {"kind": "grpo", "num_generations": 8, "max_completion_length": 4, "beta": 0.0,
               "rewards": [{"kind": "answer", "column": "answer", "primary": True}]},
    "train": {"max_seq_len": 128, "micro_batch": 64, "precision": "bf16"},
    "launch": {"gpus": 1},
}
GRPO_PEAK_GIB = 11.02  # measured: 64 completions of demo:digits prompts (29-39 tokens) + 4 tokens
LIGER_PEAK_GIB = 37.46  # measured: 97.7 % of each 8 x 2,048-token micro batch filled


def _gib(recipe: dict, config: dict, **kwargs) -> float:
    return estimate_recipe(recipe_from_dict(recipe), config, 1, cuda=True, **kwargs).total / GIB


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_rl_estimate_counts_completions_not_sft_logits(kind):
    recipe = copy.deepcopy(GRPO)
    recipe["method"]["kind"] = kind
    est = _gib(recipe, QWEN)
    # an upper bound: rows of max_seq_len (128) where the run's were ~43 tokens (the batch's longest
    # prompt + 4); it was 28.69 GiB (+160 %) when logits of every position were counted
    assert GRPO_PEAK_GIB <= est <= 1.45 * GRPO_PEAK_GIB
    # with rows as long as the run's, the estimate is within 10 % of the peak
    recipe["train"]["max_seq_len"] = 43
    assert abs(_gib(recipe, QWEN) / GRPO_PEAK_GIB - 1) <= 0.10


def test_rl_generation_has_its_own_peak():
    # one completion per micro batch, 64 generated at once (grad_accum), long: the KV cache dominates
    recipe = copy.deepcopy(GRPO)
    recipe["model"]["name"] = "meta-llama/Llama-3.1-8B"
    recipe["method"].update(max_completion_length=4000, num_generations=8)
    recipe["train"].update(max_seq_len=4096, micro_batch=1, grad_accum=64)
    config = PRESET_CONFIGS["meta-llama/Llama-3.1-8B"]
    est = estimate_recipe(recipe_from_dict(recipe), config, 1, cuda=True)
    assert est.memory.activations == generation_bytes(model_shape(config), 64, 4096)
    # vLLM generates outside torch's allocator (its share of the GPU is counted apart)
    recipe["method"]["generation_backend"] = "vllm"
    assert estimate_recipe(recipe_from_dict(recipe), config, 1, cuda=True).memory.activations < est.memory.activations
    assert "completion tokens only" in format_estimate(est)


def test_liger_estimate_within_ten_percent_of_the_measured_peak():
    recipe = {"model": {"name": "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "attn_implementation": "torch_varlen"},
              "method": {"kind": "sft"},
              "train": {"max_seq_len": 2048, "micro_batch": 8, "precision": "bf16", "packing": True,
                        "liger_kernel": True, "batching": "tokens"}}
    assert abs(_gib(recipe, LLAMA_1B) / LIGER_PEAK_GIB - 1) <= 0.10  # was 44.30 GiB (+18.2 %)
    assert 0.68 < liger_kept(model_shape(LLAMA_1B)) < 0.70


@pytest.mark.parametrize("attn", ["eager", "sdpa", "torch_varlen"])
def test_without_liger_the_layer_term_is_unchanged(attn):
    # the 0.5 B runs without Liger (eager -7.4 %, sdpa -3.8 %, torch_varlen +1.7 % at 77 % fill) keep their figures
    recipe = {"model": {"name": "Qwen/Qwen2.5-0.5B", "attn_implementation": attn}, "method": {"kind": "sft"},
              "train": {"max_seq_len": 1024, "micro_batch": 8, "precision": "bf16", "packing": True}}
    est = estimate_recipe(recipe_from_dict(recipe), QWEN, 1, cuda=True)
    assert est.memory.activations == activation_bytes(seq_len=1024, micro_batch=8, hidden=896, heads=14, layers=24,
                                                      vocab=151936, checkpointing=False,
                                                      fused_attention=attn != "eager")
    if attn != "eager":
        assert round(est.total / GIB, 2) == 28.69


@pytest.mark.parametrize("config", [
    dict(model_type="qwen2", vocab_size=512, hidden_size=128, intermediate_size=688, num_attention_heads=4,
         num_key_value_heads=2),
    dict(model_type="llama", vocab_size=512, hidden_size=128, intermediate_size=352, num_attention_heads=4,
         num_key_value_heads=1),
], ids=["qwen2", "llama"])
def test_layer_values_are_what_a_transformers_layer_saves(config):
    """The bytes a bf16 decoder layer (sdpa) hands autograd per token, counted once per storage, against
    layer_values: the count Liger's share is taken of."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tokens = 256

    def saved(layers: int) -> int:
        hf = transformers.AutoConfig.for_model(**config, num_hidden_layers=layers)
        hf._attn_implementation = "sdpa"
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(hf).to(torch.bfloat16)
        storages: dict[int, int] = {}

        def pack(tensor):
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            model.model(input_ids=torch.randint(0, config["vocab_size"], (1, tokens)))
        weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        return sum(n for ptr, n in storages.items() if ptr not in weights)

    per_token = (saved(2) - saved(1)) / tokens
    counted = 2 * layer_values(model_shape({**config, "num_hidden_layers": 2}))
    assert abs(per_token / counted - 1) <= 0.03
