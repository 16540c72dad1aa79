"""Memory estimate per GPU from a model's config alone (no weights are read).

Model states follow the ZeRO paper (Rajbhandari et al. 2020) for mixed-precision Adam, K = 12:
2 bytes fp16/bf16 params + 2 bytes grads + 12 bytes fp32 params/momentum/variance per parameter.

    stage 0: 16P          stage 1: 4P + 12P/N      stage 2: 2P + 14P/N      stage 3: 16P/N

With `deepspeed_buffers=True` (what `estimate_recipe` uses) the working buffers that DeepSpeed's
own estimators count are added, so the totals equal `estimate_zero2/3_model_states_mem_needs`:
the fp32 gradient partition the optimizer steps on (4 bytes per trainable parameter, sharded like
the optimizer; under ZeRO-3 it takes the place of the 16-bit grad shard) and, under ZeRO-3, the
gathered 16-bit weight + gradient of the largest layer (4 bytes per parameter of that layer).
With the optimizer offloaded to the CPU, the GPU buffers DeepSpeed 0.19's offload path allocates
are added too (`offload_gpu_buffers`): the gradient reduction bucket (reduce_bucket_size elements,
hidden² as the Trainer fills 'auto'), and under ZeRO-1/2 the GPU staging buffer of the largest
parameter (`temp_grad_buffer_for_gpu_offload`) and that parameter's 16-bit gradient before it
reaches the bucket; the pinned fp32 gradient partition is CPU memory (cpu_offload_total).

Activations follow Korthikanti et al. 2022 (see `activation_bytes`). GB here means 1e9 bytes.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuiapp.core.common.errors import RecipeError
from tuiapp.core.common.methods import (
    METHODS,
    from_config,
    has_magnitudes,
    is_distill,
    is_full,
    is_lora,
    is_quantized,
    is_rl,
    is_trl,
    virtual_at,
)
from tuiapp.core.config import optimizer
from tuiapp.core.config.recipe import (
    METHOD_MODELS,
    LoraMethod,
    Recipe,
    tokens_per_batch,
    weights_method,
)
from tuiapp.core.data import tiny_vlm
from tuiapp.core.plan import model_profile, vision_plan
from tuiapp.core.plan.generation_server import memory_share, server_gpu_count
from tuiapp.core.run_folder import rundir
from tuiapp.core.run_folder.progress import plural

GB = 1e9
# Fraction of GPU memory a run may plan to use; the rest goes to the CUDA context, NCCL buffers
# and allocator fragmentation.
USABLE_FRACTION = 0.9
# 4-bit storage per weight: 4 bits + the blockwise fp32 absmax (0.5 bit per weight at block size
# 64), or 0.127 bit when the constants are quantized again (double quantization, QLoRA paper).
QLORA_BYTES = {True: 4.127 / 8, False: 4.5 / 8}
# Host memory of a rank beyond its model: torch, transformers, datasets and DeepSpeed imported, its data
# memory-mapped, what its first step sets up once (a warm rank's peak on the tiny model at 256 tokens,
# less its model states and activations: 565-575 MB at 1 and 2 CPU ranks, bench/RESULTS.md section 7;
# 480 MB in "Data at any size" with the libraries of then); what tokenizing in the rank adds while a
# dataset is first cached (805-890 MB cold against 480 warm, "Data at any size"); what each tokenizing
# worker process adds (a fork of the rank) for a corpus of 20,000+ documents.
RANK_RUNTIME_BYTES = 570 * 10**6
# A CPU rank's activations cost more resident memory than their bytes: glibc's malloc, once it frees a
# block it had mmapped (a tensor of 128 KB+), raises its mmap threshold to that size (up to 32 MB), so
# the activations come from its heap from then on, and the heap keeps what is freed. Freed and made
# again each step in other sizes and orders, they fragment it: a rank's resident peak is its live
# tensors' peak plus this share of its activations. Measured (bench/RESULTS.md section 7, the tiny
# model, 3 steps): 0.44 of the live activations in one process at 4,096 and 8,192 tokens
# (torch.profiler's allocations against VmHWM); in the ranks, against the same run with
# MALLOC_MMAP_THRESHOLD_ fixed (which keeps nothing), 0.3 of the estimate's activations at degree 1
# and 0.5-0.6 at degree 2 (8,192 tokens). Host memory only: a GPU's activations are the CUDA caching
# allocator's, which USABLE_FRACTION leaves room for.
CPU_HEAP_RETAINED = 0.4
TOKENIZING_BYTES = 400 * 10**6
TOKENIZE_WORKER_BYTES = 600 * 10**6
TOKENIZE_WORKERS_MAX = 8  # tuiapp.trainer.dataset.tokenize_cache.MAX_WORKERS

# The bundled tiny model (tuiapp/assets builds it from this dict).
PROFILE_COUNTS = "llmtui_parameters"  # a config dict's key for the model profile's parameter counts
TINY_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 2048,
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
}


def _preset(model_type, vocab, hidden, inter, layers, heads, kv, positions, tied):
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[model_type]
    return {
        "architectures": [arch], "model_type": model_type, "vocab_size": vocab,
        "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv,
        "max_position_embeddings": positions, "tie_word_embeddings": tied,
    }


# Real config.json values of well-known models, so `llmtui estimate` works offline.
PRESET_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-0.5B": _preset("qwen2", 151936, 896, 4864, 24, 14, 2, 32768, True),
    "Qwen/Qwen2.5-0.5B-Instruct": _preset("qwen2", 151936, 896, 4864, 24, 14, 2, 32768, True),
    "Qwen/Qwen2.5-1.5B": _preset("qwen2", 151936, 1536, 8960, 28, 12, 2, 131072, True),
    "Qwen/Qwen2.5-1.5B-Instruct": _preset("qwen2", 151936, 1536, 8960, 28, 12, 2, 32768, True),
    "Qwen/Qwen2.5-7B": _preset("qwen2", 152064, 3584, 18944, 28, 28, 4, 131072, False),
    "meta-llama/Llama-3.2-1B": _preset("llama", 128256, 2048, 8192, 16, 32, 8, 131072, True),
    "meta-llama/Llama-3.2-3B": _preset("llama", 128256, 3072, 8192, 28, 24, 8, 131072, True),
    "meta-llama/Llama-3.1-8B": _preset("llama", 128256, 4096, 14336, 32, 32, 8, 131072, False),
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0": _preset("llama", 32000, 2048, 5632, 22, 32, 4, 2048, False),
    "Qwen/Qwen2.5-VL-3B-Instruct": {  # a vision-language model: its vision tower and projector too
        **_preset("qwen2", 151936, 2048, 11008, 36, 16, 2, 128000, True), "model_type": "qwen2_5_vl",
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "vision_config": {"model_type": "qwen2_5_vl", "depth": 32, "hidden_size": 1280, "intermediate_size": 3420,
                          "num_heads": 16, "out_hidden_size": 2048, "patch_size": 14, "spatial_merge_size": 2,
                          "temporal_patch_size": 2, "in_chans": 3}},
}


# ---------------------------------------------------------------- model shape


@dataclass(frozen=True)
class Linear:
    """One linear layer inside a transformer block; `name` is its path within the block."""

    name: str
    in_features: int
    out_features: int
    bias: bool = False

    @property
    def params(self) -> int:
        return self.in_features * self.out_features + (self.out_features if self.bias else 0)


@dataclass(frozen=True)
class ModelShape:
    family: str  # "llama" (also mistral, qwen2/3), "gpt2" or "gpt_neox"
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    positions: int  # learned position embeddings (gpt2); 0 for rotary models
    linears: tuple[Linear, ...]  # per block
    experts: int  # MLP experts per block (1 = dense)
    norm_params: int  # per block
    final_norm_params: int

    @property
    def block_params(self) -> int:
        attn = sum(l.params for l in self.linears if not _is_mlp(l))
        mlp = sum(l.params for l in self.linears if _is_mlp(l)) * self.experts
        router = self.hidden * self.experts if self.experts > 1 else 0
        return attn + mlp + router + self.norm_params


def _is_mlp(linear: Linear) -> bool:
    return linear.name.startswith("mlp.")


def _get(config: dict, *keys: str, default: Any = None) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return default


def _require(config: dict, *keys: str) -> int:
    value = _get(config, *keys)
    if value is None:
        raise RecipeError(
            message=f"the model config has no '{keys[0]}'; cannot estimate its size",
            key="model.name",
            fix="use a decoder-only HF model (llama, mistral, qwen2, gpt2, gpt-neox style config)",
        )
    return int(value)


def model_shape(config: dict) -> ModelShape:
    """Read the architecture numbers from an HF config dict (nested text_config supported)."""
    if "text_config" in config and _get(config, "hidden_size", "n_embd") is None:
        config = {**config, **config["text_config"]}
    model_type = str(config.get("model_type", ""))
    family = "gpt2" if model_type == "gpt2" or "n_embd" in config else (
        "gpt_neox" if model_type == "gpt_neox" else "llama")
    vocab = _require(config, "vocab_size")
    hidden = _require(config, "hidden_size", "n_embd", "d_model")
    layers = _require(config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _require(config, "num_attention_heads", "n_head")
    kv_heads = int(_get(config, "num_key_value_heads", default=heads))
    head_dim = int(_get(config, "head_dim", default=hidden // heads))
    inter = int(_get(config, "intermediate_size", "n_inner", default=4 * hidden))
    tied = bool(_get(config, "tie_word_embeddings", default=family == "gpt2"))
    experts = int(_get(config, "num_local_experts", default=1))
    if family == "gpt2":
        linears = (
            Linear("attn.c_attn", hidden, 3 * hidden, True), Linear("attn.c_proj", hidden, hidden, True),
            Linear("mlp.c_fc", hidden, inter, True), Linear("mlp.c_proj", inter, hidden, True),
        )
        positions = int(_get(config, "n_positions", "max_position_embeddings", default=1024))
        return ModelShape(family, vocab, hidden, layers, heads, heads, hidden // heads, inter, tied,
                          positions, linears, 1, 4 * hidden, 2 * hidden)
    if family == "gpt_neox":
        bias = bool(config.get("attention_bias", True))
        linears = (
            Linear("attention.query_key_value", hidden, 3 * hidden, bias),
            Linear("attention.dense", hidden, hidden, bias),
            Linear("mlp.dense_h_to_4h", hidden, inter, True),
            Linear("mlp.dense_4h_to_h", inter, hidden, True),
        )
        return ModelShape(family, vocab, hidden, layers, heads, heads, hidden // heads, inter, tied,
                          0, linears, 1, 4 * hidden, 2 * hidden)
    # llama style: qwen2 always has q/k/v biases; others follow attention_bias / mlp_bias
    attn_bias = bool(config.get("attention_bias", False))
    qkv_bias = attn_bias or model_type == "qwen2"
    mlp_bias = bool(config.get("mlp_bias", False))
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    linears = (
        Linear("self_attn.q_proj", hidden, q_dim, qkv_bias),
        Linear("self_attn.k_proj", hidden, kv_dim, qkv_bias),
        Linear("self_attn.v_proj", hidden, kv_dim, qkv_bias),
        Linear("self_attn.o_proj", q_dim, hidden, attn_bias),
        Linear("mlp.gate_proj", hidden, inter, mlp_bias),
        Linear("mlp.up_proj", hidden, inter, mlp_bias),
        Linear("mlp.down_proj", inter, hidden, mlp_bias),
    )
    norms = 2 * hidden + (2 * head_dim if model_type == "qwen3" else 0)  # qwen3: q_norm, k_norm
    return ModelShape(family, vocab, hidden, layers, heads, kv_heads, head_dim, inter, tied,
                      0, linears, experts, norms, hidden)


def count_parameters(config: dict) -> int:
    """Exact parameter count of a decoder-only causal LM (tied embeddings counted once): the
    model profile's count when the config carries it (any architecture), else from the shape."""
    if PROFILE_COUNTS in config:
        return int(config[PROFILE_COUNTS]["total"])
    shape = model_shape(config)
    embeddings = shape.vocab * shape.hidden + shape.positions * shape.hidden
    head = 0 if shape.tied else shape.vocab * shape.hidden
    return embeddings + shape.layers * shape.block_params + shape.final_norm_params + head


def largest_layer_params(config: dict) -> int:
    """Parameters of the largest single module (DeepSpeed's `largest_layer_params` for ZeRO-3)."""
    shape = model_shape(config)
    return max([shape.vocab * shape.hidden] + [l.params for l in shape.linears])


def apply_method_overrides(config: dict, method) -> dict:
    """The config the trainer builds: pretrain may override hidden size and layer count."""
    if not from_config(getattr(method, "kind", None)) or not (method.hidden_size or method.num_layers):
        return config
    config = dict(config)
    config.pop(PROFILE_COUNTS, None)  # counted for the config as it was
    if method.hidden_size:
        config.pop("head_dim", None)  # derived again from hidden_size / heads
        config["n_embd" if "n_embd" in config else "hidden_size"] = method.hidden_size
    if method.num_layers:
        config["n_layer" if "n_layer" in config else "num_hidden_layers"] = method.num_layers
    return config


# ---------------------------------------------------------------- trainable parameters


def _as_method(method):
    """A method model (from a kind name); a preference method counts as the weights it trains."""
    return weights_method(METHOD_MODELS[method]() if isinstance(method, str) else method)


def targeted_linears(config: dict, targets) -> list[Linear]:
    """Block linears a LoRA `target_modules` selects, matched like peft (name or '.name' suffix).
    'all-linear' = every linear in the blocks (lm_head is never adapted)."""
    linears = model_shape(config).linears
    if targets == "all-linear":
        return list(linears)
    return [l for l in linears if any(l.name == t or l.name.endswith("." + t) for t in targets)]


def _ia3_vectors(shape: ModelShape, model_type: str, targets) -> int:
    # peft's default targets: key, value (qwen2/3, gemma: query, value) and the MLP's output
    # projection. Feed-forward (MLP output) targets scale their input, the others their output.
    if targets == "auto":
        defaults = {"gpt2": ("c_attn", "mlp.c_proj"), "gpt_neox": ("query_key_value", "dense_4h_to_h")}
        targets = defaults.get(shape.family, ("k_proj", "v_proj", "down_proj"))
        if model_type.startswith(("qwen2", "qwen3", "gemma")):
            targets = ("q_proj", "v_proj", "down_proj")
    chosen = [l for l in shape.linears if any(l.name == t or l.name.endswith("." + t) for t in targets)]
    feedforward = {"mlp.down_proj", "mlp.c_proj", "mlp.dense_4h_to_h"}
    return sum(l.in_features if l.name in feedforward else l.out_features for l in chosen)


def _lora_parameters(shape: ModelShape, config: dict, method) -> int:
    chosen = targeted_linears(config, method.target_modules)
    per_block = sum(method.rank * (l.in_features + l.out_features) for l in chosen)
    if has_magnitudes(method.kind):
        per_block += sum(l.out_features for l in chosen)
    return shape.layers * per_block


def _prefix_parameters(shape: ModelShape, config: dict, method) -> int:
    d = shape.kv_heads * shape.head_dim if "num_key_value_heads" in config else shape.hidden
    out = shape.layers * 2 * d
    if not method.projection:
        return method.virtual_tokens * out
    e = method.encoder_hidden_size
    return method.virtual_tokens * d + (d * e + e) + (e * out + out)


def _ptuning_parameters(shape: ModelShape, config: dict, method) -> int:
    h, e = shape.hidden, method.encoder_hidden_size
    if method.encoder_type == "MLP":
        encoder = (h * e + e) + (e * e + e) + (e * h + h)
    else:
        lstm = 2 * (4 * e * (h + e) + 8 * e) + 2 * (4 * e * (2 * e + e) + 8 * e)
        encoder = lstm + (2 * e * 2 * e + 2 * e) + (2 * e * h + h)
    return method.virtual_tokens * h + encoder


ADAPTER_PARAMETERS = {
    "lora": _lora_parameters,
    "qlora": _lora_parameters,
    "dora": _lora_parameters,
    "prefix": _prefix_parameters,
    "prompt": lambda shape, config, method: method.virtual_tokens * shape.hidden,
    "ptuning": _ptuning_parameters,
    "ia3": lambda shape, config, method: shape.layers * _ia3_vectors(shape, str(config.get("model_type", "")),
                                                                     method.target_modules),
    "adapter": lambda shape, config, method: shape.layers * (2 * shape.hidden * method.bottleneck_size
                                                             + method.bottleneck_size + shape.hidden),
    "llama-adapter": lambda shape, config, method: min(method.adapter_layers, shape.layers)
    * (method.adapter_len * shape.hidden + 1),
}
"""Trainable parameters of each adapter kind (tests/core/test_estimate.py checks them against peft):

lora, qlora       r * (in + out) per targeted linear per block (A: r x in, B: out x r).
dora              lora + a magnitude vector of `out` per targeted linear.
prefix            per peft: virtual * layers * 2 * d with d = kv_heads * head_dim; with
                  projection: virtual * d + (d*e + e) + (e * layers*2*d + layers*2*d).
prompt            virtual * hidden.
ptuning           virtual * hidden + encoder. MLP: (h*e+e) + (e*e+e) + (e*h+h);
                  LSTM (2 bidirectional layers, then 2e -> 2e -> h MLP).
ia3               one vector per targeted module (in_features for the MLP output, else out).
adapter           per block: down h*m + m, up m*h + h.
llama-adapter     per adapted top layer: adapter_len * hidden prompt + 1 gate."""


def trainable_parameters(config: dict, method) -> int:
    """Trainable parameters of `method` (a recipe method model or a kind name) on this config: every
    parameter when every weight trains, else the adapter's (ADAPTER_PARAMETERS)."""
    method = _as_method(method)
    if is_full(method.kind):
        return count_parameters(apply_method_overrides(config, method))
    return ADAPTER_PARAMETERS[method.kind](model_shape(config), config, method)


# ---------------------------------------------------------------- optimizer state


def trainable_shapes(config: dict, method) -> list[tuple[tuple[int, ...], str, str]] | None:
    """(shape, role, name) of each trainable parameter, as train.optimizer's state counts them:
    the full model (pretrain, sft) or the LoRA/DoRA matrices; None for other methods (their
    parameters are then counted as vectors)."""
    method = _as_method(method)
    config = apply_method_overrides(config, method)
    if PROFILE_COUNTS in config and is_full(method.kind):
        return None  # an architecture the shape does not describe: its exact count only
    shape = model_shape(config)
    h, out = shape.hidden, []
    if is_full(method.kind):
        out.append(((shape.vocab, h), "embedding", "embed_tokens"))
        if shape.positions:
            out.append(((shape.positions, h), "embedding", "embed_positions"))
        for _ in range(shape.layers):
            for linear in shape.linears:
                copies = shape.experts if _is_mlp(linear) else 1
                for _ in range(copies):
                    out.append(((linear.out_features, linear.in_features), "hidden", linear.name))
                    if linear.bias:
                        out.append(((linear.out_features,), "other", linear.name + ".bias"))
            if shape.experts > 1:
                out.append(((shape.experts, h), "other", "router"))
            out.append(((shape.norm_params,), "other", "norm"))
        out.append(((shape.final_norm_params,), "other", "norm"))
        if not shape.tied:
            out.append(((shape.vocab, h), "head", "lm_head"))
        return out
    if is_lora(method.kind):
        for _ in range(shape.layers):
            for linear in targeted_linears(config, method.target_modules):
                out.append(((method.rank, linear.in_features), "hidden", linear.name + ".lora_A"))
                out.append(((linear.out_features, method.rank), "hidden", linear.name + ".lora_B"))
                if has_magnitudes(method.kind):
                    out.append(((linear.out_features,), "other", linear.name + ".magnitude"))
        return out
    return None


def optimizer_state_bytes(config: dict, recipe: Recipe, method, trainable: int, zero_stage: int = 0) -> float:
    """State bytes of train.optimizer over the trainable parameters (unsharded)."""
    spec = recipe.train.optimizer
    shapes = trainable_shapes(config, method)
    if shapes is None or sum(optimizer.numel(s) for s, _, _ in shapes) != trainable:
        shapes = [((int(trainable),), "other", "")]  # vision parts, other adapters: vectors
    return float(optimizer.state_bytes(spec, shapes, flattened=zero_stage >= 1))


# ---------------------------------------------------------------- memory


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU, plus what offload puts in CPU memory (per node)."""

    params: int
    grads: int
    optimizer: int
    buffers: int = 0  # DeepSpeed working buffers (fp32 grad partition, ZeRO-3 gathered layer)
    activations: int = 0
    cpu_offload_total: int = 0
    reference: int = 0  # frozen reference model of DPO/KTO with full weights (sharded by ZeRO-3)
    teacher_pass: int = 0  # distill offline: the teacher's weights, alone, for its top-k pass before training

    @property
    def model_states(self) -> int:
        """Weights + gradients + optimizer states: the ZeRO paper's model states (16P ... 16P/N)."""
        return self.params + self.grads + self.optimizer

    @property
    def training(self) -> int:
        return self.model_states + self.buffers + self.activations + self.reference

    @property
    def total(self) -> int:
        """The peak: training, or an offline teacher's pass before it when that is larger."""
        return max(self.training, self.teacher_pass)

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "model_states": self.model_states, "training": self.training,
                "total": self.total}


def _half(precision: str) -> bool:
    return precision != "fp32"  # "auto" means 16-bit on a GPU


def model_state_bytes(
    total_params: int,
    trainable_params: int,
    zero_stage: int,
    n_gpus: int,
    offload_optimizer: str = "none",
    offload_params: str = "none",
    precision: str = "bf16",
    *,
    gpus_per_node: int | None = None,
    frozen_bytes: float | None = None,
    largest_layer_params: int = 0,
    deepspeed_buffers: bool = False,
    reduce_bucket: int = 0,
    optimizer_state: float | None = None,
) -> MemoryBreakdown:
    """Model-state bytes per GPU for Adam, with `n_gpus` = the data-parallel world size N.

    Trainable parameters T cost 2 (weight) + 2 (grad) + 12 (fp32 master, momentum, variance) bytes
    in mixed precision, 4 + 4 + 8 in fp32. Frozen ones (adapter methods) cost only their weight:
    `frozen_bytes` in total (default 2 or 4 bytes each); ZeRO-3 shards them too.
    Optimizer states are sharded from stage 1, grads from 2, weights at 3.

    Offload (stage >= 1) moves the optimizer states to CPU, and from stage 2 the gradients too,
    where DeepSpeed keeps them in fp32; stage 1 keeps its full grads on GPU and adds the fp32
    partition on CPU. `offload_params` (stage 3) moves the weight shards as well. Offload with
    a stage that does not support it is ignored (preflight reports it). `cpu_offload_total` is per
    node: `gpus_per_node` (default n_gpus) ranks each holding its shard.
    """
    n = max(1, int(n_gpus))
    per_node = max(1, int(gpus_per_node or n))
    trainable = max(0, min(int(trainable_params), int(total_params)))
    half = _half(precision)
    weight_b, grad_b, optim_b = (2, 2, 12) if half else (4, 4, 8)
    frozen_bytes = max(0, int(total_params) - trainable) * weight_b if frozen_bytes is None else frozen_bytes
    offload_opt = offload_optimizer != "none" and zero_stage >= 1
    offload_w = offload_params != "none" and zero_stage == 3

    def shard(value: float, sharded: bool) -> float:
        return value / n if sharded else value
    params = shard(trainable * weight_b + frozen_bytes, zero_stage == 3)
    grads = shard(trainable * grad_b, zero_stage >= 2)
    if optimizer_state is not None:  # train.optimizer's own state (AdamW: 8 bytes a parameter), + fp32 master
        optim_b = optimizer_state / max(1, trainable) + (4 if half else 0)
    optimizer = shard(trainable * optim_b, zero_stage >= 1)
    fp32_grads = shard(trainable * 4, zero_stage >= 1) if half else 0.0
    fp32_grads -= grads if zero_stage == 3 else 0  # ZeRO-3 reduces grads into the fp32 partition: it replaces the shard
    cpu = 0.0
    if offload_opt:  # the optimizer states and the fp32 grad partition it steps on go to the CPU
        cpu, optimizer, fp32_grads = optimizer + shard(trainable * 4, True), 0.0, 0.0
        grads = 0.0 if zero_stage >= 2 else grads
    if offload_w:
        cpu, params = cpu + params, 0.0
    buffers = 0.0
    if deepspeed_buffers:
        buffers = fp32_grads + (4 * largest_layer_params if zero_stage == 3 else 0)
        if offload_opt and trainable:
            buffers += offload_gpu_buffers(zero_stage, reduce_bucket, largest_layer_params, half)
    return MemoryBreakdown(params=int(params), grads=int(grads), optimizer=int(optimizer), buffers=int(buffers),
                           cpu_offload_total=int(cpu * per_node))


def offload_gpu_buffers(zero_stage: int, reduce_bucket: int, largest_param: int, half: bool) -> int:
    """GPU bytes DeepSpeed 0.19 adds when the optimizer is offloaded to the CPU (ZeRO-Offload).

    stage_1_and_2.py: `setup_buckets` makes the reduction bucket of `reduce_bucket_size` elements
    (fp32 under ZeRO-1, the 16-bit dtype under ZeRO-2; offload forces contiguous_gradients), and
    `temp_grad_buffer_for_gpu_offload` holds the largest parameter's gradient on its way to the
    CPU, next to that gradient itself before it is copied into the bucket. stage3.py: the bucket
    (16-bit), the gradient partitions are pinned CPU memory under offload."""
    value = 2 if half else 4
    bucket = reduce_bucket * (4 if zero_stage == 1 else value)
    if zero_stage == 3:
        return bucket
    return bucket + 2 * largest_param * value


# The logits' share of the activation peak, which comes at the start of the loss's backward: the
# cross-entropy's log-softmax output (fp32, saved for the backward), the NLL's gradient of it and the
# log-softmax's gradient, the logits' own (s*b*vocab each, fp32 in every training dtype: transformers'
# causal LM loss upcasts). The logits themselves (and a 16-bit run's fp32 upcast) are gone by then: the
# Trainer keeps the loss only, and nothing saves them for the backward. torch.profiler's memory timeline
# of the tiny model's step (fp32 and bf16, CPU) shows these three logits-sized tensors live at the peak.
LOSS_BYTES_PER_LOGIT = 12


def activation_bytes(
    *,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    heads: int,
    layers: int,
    vocab: int,
    checkpointing: bool,
    bytes_per_value: int = 2,
    fused_attention: bool = True,
    fused_loss: bool = False,
    kept: float = 1.0,
) -> int:
    """Activation memory of one micro batch (Korthikanti et al. 2022, no tensor parallelism).

    Per layer, 16-bit: s*b*h*(34 + 5*a*s/h) bytes, with s = sequence, b = micro batch,
    h = hidden, a = heads. The 5*a*s^2*b term is the stored attention scores; fused attention
    (SDPA/flash, transformers' default) does not store them, so it is dropped then.
    With gradient checkpointing only each layer's input is kept (2*s*b*h bytes per layer) plus
    one layer's full activations while it is recomputed. fp32 doubles everything.
    The logits for the loss are added: LOSS_BYTES_PER_LOGIT for each of the s*b*vocab logits, the
    three fp32 copies the loss's backward holds; a fused linear cross-entropy (Liger) computes the
    loss chunk by chunk and never holds them (`fused_loss`).
    `kept` scales the 34*s*b*h term: the share of it that fused kernels keep (`liger_kept`).
    """
    sbh = seq_len * micro_batch * hidden
    scale = bytes_per_value / 2
    scores = 0 if fused_attention else 5 * heads * seq_len * seq_len * micro_batch
    full_layer = (34 * sbh * kept + scores) * scale
    if checkpointing:
        body = layers * 2 * sbh * scale + full_layer
    else:
        body = layers * full_layer
    logits = 0 if fused_loss else seq_len * micro_batch * vocab * LOSS_BYTES_PER_LOGIT
    return int(body + logits)


def layer_values(shape: ModelShape, liger: bool = False) -> int:
    """16-bit values a llama-style layer keeps for its backward per token (sdpa/flash attention).
    transformers' modules: each RMSNorm its input upcast to fp32 (2 values a channel), the normalized
    16-bit tensor its weight multiplies, and its output (the next linears' input); attention q, k, v
    after RoPE and its output (RoPE's products by cos/sin keep only cos/sin); the MLP gate, up, silu(gate)
    and their product (down_proj's input). Liger's kernels: RMSNorm keeps its 16-bit input (and a
    per-row rstd), not the fp32 copy nor the normalized tensor; SwiGLU keeps gate and up and recomputes
    silu(gate); its RoPE keeps what transformers' does. tests/core/test_estimate_h200.py checks the
    transformers count against the tensors a real layer saves."""
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    attention = 2 * q + 2 * kv
    if liger:
        return 2 * 2 * shape.hidden + attention + 3 * shape.intermediate
    return 2 * 4 * shape.hidden + attention + 4 * shape.intermediate


def liger_kept(shape: ModelShape) -> float:
    """The share of a layer's activations that Liger's RMSNorm/SwiGLU keep: the 34*s*b*h term stands for
    transformers' layer (it is what the measured peaks without Liger follow), so it is scaled by what
    Liger keeps of what transformers' modules keep (layer_values). 0.69 for the ~1.1 B llama shape,
    0.71 for Qwen2.5-0.5B. Only llama-style models (RMSNorm, SwiGLU) get Liger's kernels."""
    if shape.family != "llama" or shape.experts > 1:
        return 1.0
    return layer_values(shape, liger=True) / layer_values(shape)


def liger_loss_bytes(tokens: int, hidden: int, vocab: int, head_trains: bool, value: int = 2) -> int:
    """Liger's fused linear cross-entropy holds no logits but computes the gradients in its forward and
    keeps them until the backward: the head's (vocab x hidden, when it trains) and the hidden states'
    (tokens x hidden), beside a chunk of logits (tokens / ceil(vocab / hidden) rows rounded up to a power
    of two: up to 2 x tokens x hidden values)."""
    return value * (vocab * hidden * int(head_trains) + 3 * tokens * hidden)


# TRL's chunked log-prob head (trl/kernels/chunked_logprob.py): token rows and vocabulary columns per tile
RL_HEAD_TOKENS, RL_HEAD_VOCAB = 4096, 32768


def rl_head_bytes(tokens: int, hidden: int, vocab: int, head_trains: bool, value: int = 2) -> int:
    """GRPO/RLOO score completions through TRL's fused LM head (`add_fused_lm_head`): the hidden states of
    the `tokens` completion positions are kept (16-bit), never the logits; its backward accumulates the
    head's gradient in fp32 (vocab x hidden, then cast to 16 bits) and the hidden states' (fp32, then
    16 bits) beside one tile of logits. That backward runs first, while every layer's activations live."""
    head = vocab * hidden * (4 + value) if head_trains else 0
    tile = min(tokens, RL_HEAD_TOKENS) * min(vocab, RL_HEAD_VOCAB) * value
    return head + tokens * hidden * (value + 4 + value) + tile


def generation_bytes(shape: ModelShape, sequences: int, seq_len: int, value: int = 2) -> int:
    """The peak of an RL step's generation (model.generate, no gradients) beside the model states: the KV
    cache of `sequences` sequences of seq_len tokens, one layer's MLP of the prompt prefill (gate, up,
    silu(gate)), and the last position's logits with their fp32 copies for sampling."""
    kv = sequences * seq_len * shape.layers * 2 * shape.kv_heads * shape.head_dim * value
    prefill = 3 * sequences * seq_len * shape.intermediate * value
    return kv + prefill + sequences * shape.vocab * LOSS_BYTES_PER_LOGIT


# ---------------------------------------------------------------- recipe estimate


@dataclass(frozen=True)
class Knobs:
    """The recipe settings that change memory; suggestions are made by turning them."""

    method: Any
    zero_stage: int
    offload_optimizer: str
    offload_params: str
    gradient_checkpointing: bool
    micro_batch: int


@dataclass(frozen=True)
class Estimate:
    model: str
    method: str
    total_params: int
    trainable_params: int
    n_gpus: int  # per node
    nodes: int
    zero_stage: int
    precision: str  # resolved: bf16 / fp16 / fp32
    micro_batch: int
    seq_len: int
    gradient_checkpointing: bool
    memory: MemoryBreakdown  # per GPU
    gpu_memory_bytes: int | None
    fits: bool | None
    warning: str | None = None
    suggestions: list[str] = field(default_factory=list)
    world_size: int = 0  # ranks in all (N of the ZeRO formulas); n_gpus * nodes unless hosts differ
    pipeline: dict | None = None  # strategy 'pipeline': pipeline_plan.plan (memory is then the largest stage's)
    micro_batch_auto: bool = False  # train.micro_batch 'auto': micro_batch is the estimate's pick
    kernels: str = ""  # the kernel switches that change memory: eager attention, liger, token batches
    active_params: int = 0  # mixture of experts: the base parameters one token goes through (0 = dense)
    generation_share: float = 0.0  # grpo/rloo with vLLM colocated: the share of each GPU its engine takes
    server_gpus: int = 0  # grpo/rloo with a vLLM server: the GPUs it takes besides the ranks'
    server_share: float = 0.0  # ... and the share of each of them it fills
    cpu: bool = False  # CPU ranks (no CUDA): the setup line counts ranks, not GPUs
    ram_per_rank: int = 0  # host memory of one rank: runtime, data and (CPU ranks) its model
    ram_first_tokenizing: int = 0  # what the rank building the data cache adds while it builds it
    streaming: bool = False  # dataset.streaming: no cache to build, examples tokenized as they come
    vision: dict | None = None  # a VLM: {vision_tower, projector: parameters, image_tokens, trains: parts}
    optimizer: str = "adamw"  # train.optimizer's kind: the optimizer row's state is its own
    longest: list = field(default_factory=list)  # [(sequence_parallel degree, longest max_seq_len that fits)]
    teacher_cache: dict | None = None  # distill offline: the teacher's cached top-k on disk (plan.distill)

    @property
    def total(self) -> int:
        return self.memory.total

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["memory"] = self.memory.to_json()
        return data


def _resolve_precision(precision: str, cuda: bool) -> str:
    if precision == "auto":
        return "bf16" if cuda else "fp32"
    return precision


def reference_bytes(params: int, zero_stage: int, world: int, offload_params: str, precision: str) -> tuple[int, int]:
    """(per GPU, on CPU per rank) bytes of the frozen reference model of DPO/KTO with full
    weights: its weights alone, in the training dtype. ZeRO-3 shards it like the policy (TRL
    prepares it with the same config, optimizer removed), and offloads it with offload_params;
    below stage 3 every rank holds a whole copy."""
    size = params * (2 if _half(precision) else 4)
    if zero_stage == 3:
        size /= max(1, world)
        if offload_params != "none":
            return 0, int(size)
    return int(size), 0


def teacher_config(name: str, base_dir: str | Path | None = None) -> dict:
    """method.teacher's HF config dict (distill): the bundled 'tiny-teacher', else as load_model_config."""
    from tuiapp.core.plan.distill import TEACHER_CHANGES, TEACHER_NAME

    return {**TINY_CONFIG, **TEACHER_CHANGES} if name == TEACHER_NAME else load_model_config(name, base_dir)


def teacher_parameters(name: str, base_dir: str | Path | None = None) -> int:
    """The teacher's parameter count; 0 when its config cannot be read (distill_checks says why) or
    it is served (its own server holds it)."""
    from tuiapp.core.plan.distill import served_teacher

    if served_teacher(name):
        return 0
    try:
        return count_parameters(teacher_config(name, base_dir))
    except (RecipeError, OSError, KeyError, TypeError, ValueError):
        return 0


def _memory(config: dict, recipe: Recipe, knobs: Knobs, world: int, per_node: int, precision: str):
    method = weights_method(knobs.method)
    config = apply_method_overrides(config, method)
    shape = model_shape(config)
    base = count_parameters(config)
    full = is_full(method.kind)
    extra = 0 if full else trainable_parameters(config, method)
    total, trainable = base + extra, (base if full else extra)
    vision = vision_parts(config)
    if vision:  # a vision-language model: its vision tower and projector, as [vision] trains them
        total, trainable = vision_plan.with_vision(vision, config, recipe, base, extra)
    frozen_bytes = None
    if is_quantized(method.kind):
        quantized = shape.layers * sum(l.in_features * l.out_features for l in shape.linears)
        frozen_bytes = quantized * QLORA_BYTES[method.double_quant] + (base - quantized) * 2
    states = model_state_bytes(
        total, trainable, knobs.zero_stage, world, knobs.offload_optimizer, knobs.offload_params,
        precision, gpus_per_node=per_node, frozen_bytes=frozen_bytes,
        largest_layer_params=largest_layer_params(config), deepspeed_buffers=True,
        reduce_bucket=shape.hidden * shape.hidden,  # reduce_bucket_size 'auto' as the Trainer fills it
        optimizer_state=optimizer_state_bytes(config, recipe, method, trainable, knobs.zero_stage),
    )
    seq = recipe.train.max_seq_len + (method.virtual_tokens if virtual_at(method.kind) == "input" else 0)
    # preference batches hold two sequences per example: chosen + rejected (KTO: answer + KL answer)
    sequences = METHODS[knobs.method.kind].sequences
    states = _with_frozen_models(states, knobs, base, full, world, per_node, precision)
    rows = knobs.micro_batch
    if recipe.train.batching == "tokens":  # a micro batch is a token budget, packed in rows of seq tokens
        rows = -(-tokens_per_batch(recipe) // recipe.train.max_seq_len)
    from tuiapp.core.plan import long_context  # here: long_context reads pipeline_plan, which reads this module

    value, liger, rl = 2 if _half(precision) else 4, recipe.train.liger_kernel, is_rl(knobs.method.kind)
    acts = long_context.activations(  # train.sequence_parallel (1/N of the sequence), tiled MLP, offload
        recipe, activation_bytes, cuda=precision != "fp32",
        seq_len=seq, micro_batch=rows * sequences, hidden=shape.hidden, heads=shape.heads,
        layers=shape.layers, vocab=shape.vocab, checkpointing=knobs.gradient_checkpointing,
        bytes_per_value=value, fused_attention=recipe.model.attn_implementation != "eager",
        fused_loss=rl or liger or recipe.train.tiled_loss, kept=liger_kept(shape) if liger else 1.0,
    )
    if rl:
        acts = _rl_step_bytes(acts, shape, recipe, knobs, rows, seq, full, value,
                              gathered=max(0, base * value - states.params) if knobs.zero_stage == 3 else 0)
    elif liger:
        tokens = -(-seq * rows * sequences // long_context.degree(recipe))
        acts += liger_loss_bytes(tokens, shape.hidden, shape.vocab, full, value)
    if vision and vision_plan.trained_parts(recipe)["vision_tower"]:  # the tower's own, per image
        tower = config["vision_config"]
        acts += activation_bytes(
            seq_len=vision_plan.tower_patches(config, image_tokens(config, recipe)), micro_batch=rows,
            hidden=int(tower.get("embed_dim") or tower["hidden_size"]),
            heads=int(tower.get("num_attention_heads") or tower.get("num_heads") or 1),
            layers=int(tower.get("num_hidden_layers") or tower.get("depth") or 1), vocab=0,
            checkpointing=knobs.gradient_checkpointing, bytes_per_value=2 if _half(precision) else 4)
    return total, trainable, dataclasses.replace(states, activations=acts)


def _with_frozen_models(states, knobs: Knobs, base: int, full: bool, world: int, per_node: int, precision: str):
    """The model states with the frozen models a method keeps beside them: a reference copy of a fully
    trained model (preference methods; grpo/rloo only for a KL term), a distillation teacher."""
    copies = METHODS[knobs.method.kind].extra_copies
    copies = copies if not is_rl(knobs.method.kind) or knobs.method.beta > 0 else 0
    if full and copies:  # with an adapter: the base, adapters off
        reference, reference_cpu = reference_bytes(base, knobs.zero_stage, world, knobs.offload_params, precision)
        states = dataclasses.replace(states, reference=reference,
                                     cpu_offload_total=states.cpu_offload_total + reference_cpu * per_node)
    if is_distill(knobs.method.kind):  # the frozen teacher's weights (teacher_parameters), whole in a rank
        teacher, _ = reference_bytes(teacher_parameters(knobs.method.teacher), 0, 1, "none", precision)
        if knobs.method.mode == "online":  # beside the student at every step
            states = dataclasses.replace(states, reference=states.reference + teacher)
        else:  # offline: loaded for the top-k pass and freed before the student loads
            states = dataclasses.replace(states, teacher_pass=teacher)
    return states


def _rl_step_bytes(acts: int, shape: ModelShape, recipe: Recipe, knobs: Knobs, rows: int, seq: int, full: bool,
                   value: int, gathered: int) -> int:
    """A GRPO/RLOO step's peak beyond the model states: training (the layers' activations and TRL's fused head
    over the completion positions) or generation, whichever is larger. `gathered`: the 16-bit weights ZeRO-3
    gathers whole for generate."""
    # TRL trains on micro_batch completions (prompt + completion, padded to the batch's longest: max_seq_len
    # at most) and scores only the completion positions, through its fused head
    completion = min(knobs.method.max_completion_length, seq)
    acts += rl_head_bytes(rows * completion, shape.hidden, shape.vocab, full, value)
    if knobs.method.generation_backend != "transformers":  # vLLM's memory is its share of the GPU
        return acts
    # TRL generates for micro_batch x grad_accum completions at once (steps_per_generation)
    return max(acts, generation_bytes(shape, rows * recipe.train.grad_accum, seq, value) + gathered)


def vision_parts(config: dict) -> dict[str, int] | None:
    """A VLM's vision tower and projector parameters (None for a text model, or when the model
    profile's exact count already holds them)."""
    if "vision_config" not in config or PROFILE_COUNTS in config:
        return None
    return vision_plan.vision_parameters(config)


def image_tokens(config: dict, recipe: Recipe) -> int:
    """Tokens one image takes in each example's sequence (0 for a text model)."""
    if "vision_config" not in config:
        return 0
    return vision_plan.image_tokens_per_image(recipe.model.name, config, recipe.vision.max_pixels)


def _candidates(knobs: Knobs, world: int, grad_accum: int) -> list[tuple[str, Knobs]]:
    """Single changes that lower memory, each as (how to write it, new knobs)."""
    out: list[tuple[str, Knobs]] = []
    kind = weights_method(knobs.method).kind
    if not knobs.gradient_checkpointing and METHODS[kind].checkpointing:
        out.append(("gradient_checkpointing=true", dataclasses.replace(knobs, gradient_checkpointing=True)))
    if world > 1 and knobs.zero_stage < 3 and not is_quantized(kind):
        out.append(("zero_stage=3", dataclasses.replace(knobs, zero_stage=3)))
    if knobs.offload_optimizer == "none":
        stage = max(knobs.zero_stage, 2)
        text = "offload_optimizer='cpu'" if stage == knobs.zero_stage else f"zero_stage={stage}, offload_optimizer='cpu'"
        out.append((text, dataclasses.replace(knobs, zero_stage=stage, offload_optimizer="cpu")))
    if knobs.offload_params == "none" and not is_quantized(kind):
        out.append(("zero_stage=3, offload_optimizer='cpu', offload_params='cpu'",
                    dataclasses.replace(knobs, zero_stage=3, offload_optimizer="cpu", offload_params="cpu")))
    batch = knobs.micro_batch * grad_accum
    for smaller in sorted({max(1, knobs.micro_batch // 2), 1}, reverse=True):
        if smaller < knobs.micro_batch:
            text = f"micro_batch={smaller}"
            if batch % smaller == 0:
                text += f", grad_accum={batch // smaller}"
            out.append((text, dataclasses.replace(knobs, micro_batch=smaller)))
    if is_full(kind) and is_trl(knobs.method.kind):
        lora = knobs.method.model_copy(update={"adapter": LoraMethod()})
        out.append(("[method.adapter] kind='lora'", dataclasses.replace(knobs, method=lora)))
    elif is_full(kind):
        out.append(("method.kind='lora'", dataclasses.replace(knobs, method=METHOD_MODELS["lora"]())))
    return out


def _advice(config, recipe, knobs, world, per_node, precision, capacity: float) -> list[str]:
    """Up to three suggestions, those that fit alone first, ranked by the memory they leave.
    When none fits alone, changes are combined greedily (biggest saving first) until one does."""
    accum = recipe.train.grad_accum

    def need(k: Knobs) -> int:
        return _memory(config, recipe, k, world, per_node, precision)[2].total

    scored = sorted((need(k), text) for text, k in _candidates(knobs, world, accum))
    fitting = [f"{text} (→ {n / GB:.1f} GB)" for n, text in scored if n <= capacity]
    if fitting:
        return fitting[:3]
    steps, current = [], knobs
    for _ in range(6):
        options = _candidates(current, world, accum)
        if not options:
            break
        best_need, text, current = min(((need(k), t, k) for t, k in options), key=lambda x: x[0])
        steps.append(text)
        if best_need <= capacity:
            return [" + ".join(steps) + f" (→ {best_need / GB:.1f} GB)"]
    return [
        f"more GPUs, a shorter max_seq_len or a smaller model (even {' + '.join(steps)} needs {need(current) / GB:.1f} GB)"
    ]


def estimate_recipe(
    recipe: Recipe,
    model_config: dict,
    n_gpus: int,
    nodes: int = 1,
    gpu_memory_bytes: int | None = None,
    *,
    cuda: bool = True,
    world: int | None = None,
) -> Estimate:
    """Estimate per-GPU memory of `recipe` on `nodes` machines with `n_gpus` GPUs each
    (`world` ranks in all when the nodes differ: hosts with unequal slots).

    `cuda=False` estimates CPU ranks (precision 'auto' resolves to fp32 there).
    `fits` is None when `gpu_memory_bytes` is unknown; otherwise the total must stay within
    USABLE_FRACTION of it, and `warning` says what to change when it does not.
    """
    n_gpus, nodes = max(1, int(n_gpus)), max(1, int(nodes))
    world = max(1, int(world)) if world else n_gpus * nodes
    precision = _resolve_precision(recipe.train.precision, cuda)
    launch, train = recipe.launch, recipe.train
    knobs = Knobs(recipe.method, launch.zero_stage, launch.offload_optimizer, launch.offload_params,
                  train.gradient_checkpointing, 1 if train.micro_batch == "auto" else train.micro_batch)
    if train.micro_batch == "auto":  # the largest power of two the estimate fits; the run probes for real
        knobs = _auto_micro_batch(model_config, recipe, knobs, world, n_gpus, precision, gpu_memory_bytes)
    total, trainable, memory = _memory(model_config, recipe, knobs, world, n_gpus, precision)
    fits, warning, suggestions = None, None, []
    share = generation_share(recipe)
    if gpu_memory_bytes:
        capacity = gpu_memory_bytes * (USABLE_FRACTION - share)
        fits = memory.total <= capacity
        if not fits:
            suggestions = _advice(model_config, recipe, knobs, world, n_gpus, precision, capacity)
            if share:
                suggestions.append(f"a lower method.vllm_gpu_memory_utilization (vLLM takes {share:.0%} of the GPU)")
            warning = (
                f"needs {memory.total / GB:.1f} GB per GPU, the GPU has {gpu_memory_bytes / GB:.1f} GB "
                f"(about {capacity / GB:.1f} GB usable{' beside vLLM' if share else ''}): try " + _join_or(suggestions)
            )
    return Estimate(
        model=recipe.model.name, method=recipe.method.kind, total_params=total,
        trainable_params=trainable, n_gpus=n_gpus, nodes=nodes, zero_stage=launch.zero_stage,
        precision=precision, micro_batch=knobs.micro_batch, seq_len=train.max_seq_len,
        gradient_checkpointing=train.gradient_checkpointing, memory=memory,
        gpu_memory_bytes=gpu_memory_bytes, fits=fits, warning=warning, suggestions=suggestions,
        world_size=world, micro_batch_auto=train.micro_batch == "auto", kernels=kernels_text(recipe),
        active_params=_active_params(model_config, recipe), generation_share=share,
        server_gpus=server_gpu_count(recipe), cpu=not cuda and nodes == 1,  # several nodes: GPUs elsewhere
        ram_per_rank=RANK_RUNTIME_BYTES + (cpu_rank_memory(memory) if not cuda else 0),
        ram_first_tokenizing=0 if recipe.dataset.streaming else TOKENIZING_BYTES,
        streaming=bool(recipe.dataset.streaming),
        server_share=memory_share(recipe.method) if server_gpu_count(recipe) else 0.0,
        vision=_vision_facts(model_config, recipe), optimizer=recipe.train.optimizer.kind,
        longest=_longest(model_config, recipe, knobs, world, n_gpus, precision, gpu_memory_bytes, share),
        teacher_cache=_teacher_cache(recipe),
    )


def cpu_rank_memory(memory: MemoryBreakdown) -> int:
    """What a CPU rank's training holds in host memory beyond its runtime: the model states and the
    activations, and what glibc's heap keeps of the activations freed (CPU_HEAP_RETAINED)."""
    return memory.total + int(CPU_HEAP_RETAINED * memory.activations)


def _teacher_cache(recipe: Recipe) -> dict | None:
    from tuiapp.core.plan.distill import teacher_cache_size

    return teacher_cache_size(recipe)


def _longest(config, recipe, knobs, world, per_node, precision, gpu_memory_bytes, share) -> list:
    """The longest train.max_seq_len that fits the GPU at each sequence-parallel degree the ranks allow."""
    if not gpu_memory_bytes or recipe.launch.strategy == "pipeline":
        return []
    from tuiapp.core.plan import long_context

    capacity = gpu_memory_bytes * (USABLE_FRACTION - share)

    def fits_at(n: int, seq: int) -> bool:
        train = recipe.train.model_copy(update={"sequence_parallel": n, "max_seq_len": seq})
        return _memory(config, recipe.model_copy(update={"train": train}), knobs, world, per_node,
                       precision)[2].total <= capacity

    return long_context.longest_sequences(fits_at, world, model_shape(config).heads)


def _vision_facts(config: dict, recipe: Recipe) -> dict | None:
    parts = vision_parts(config)
    tokens = image_tokens(config, recipe)
    if not parts and not tokens:
        return None
    trains = [part for part, on in vision_plan.trained_parts(recipe).items() if on]
    return {**(parts or {}), "image_tokens": tokens, "trains": trains}


def _vision_row(vision: dict) -> str:
    """'images       vision tower 24K params (frozen), projector 2K (trains), 6 tokens per image'."""
    def state(part: str) -> str:
        return "trains" if part in vision["trains"] else "frozen"
    parts = [f"vision tower {_count(vision['vision_tower'])} params ({state('vision_tower')}), projector "
             f"{_count(vision['projector'])} ({state('projector')})"] if "vision_tower" in vision else []
    if vision["image_tokens"]:
        parts.append(f"up to {vision['image_tokens']} tokens per image, inside max_seq_len")
    return "images       " + ", ".join(parts)


def _ram_rows(est: Estimate) -> list[str]:
    """Host memory per rank, and what building the data cache adds the first time."""
    import os

    what = "runtime and model" if est.cpu else "runtime"
    if est.streaming:
        return [f"RAM per rank {est.ram_per_rank / GB:.1f} GB ({what}); the data streamed, tokenized as it comes"]
    workers = min(TOKENIZE_WORKERS_MAX, os.cpu_count() or 1)
    return [f"RAM per rank {est.ram_per_rank / GB:.1f} GB ({what}); the data memory-mapped once cached",
            f"  caching it: +{est.ram_first_tokenizing / GB:.1f} GB in one rank, +{TOKENIZE_WORKER_BYTES / GB:.1f} GB "
            f"per worker for 20,000+ documents ({workers} here)"]


def generation_share(recipe: Recipe) -> float:
    """The share of each GPU that a colocated vLLM engine takes (its weights and KV cache: vLLM's
    gpu_memory_utilization), beside the training's memory; 0 without one."""
    method = recipe.method
    if is_rl(method.kind) and method.generation_backend == "vllm" and method.vllm_mode == "colocate":
        return float(method.vllm_gpu_memory_utilization)
    return 0.0


def _active_params(config: dict, recipe: Recipe) -> int:
    """Parameters a token goes through, from the model profile (0 when every parameter is: dense)."""
    counts = apply_method_overrides(config, recipe.method).get(PROFILE_COUNTS) or {}
    active, total = int(counts.get("active", 0)), int(counts.get("total", 0))
    return active if active and active < total else 0


def kernels_text(recipe: Recipe) -> str:
    """The settings beyond the knobs that change activation memory, as the estimate counts them."""
    parts = []
    if recipe.model.attn_implementation == "eager":
        parts.append("eager attention (stores attention scores)")
    if recipe.train.liger_kernel:
        parts.append("liger fused loss (no logits held), RMSNorm and SwiGLU")
    if is_rl(recipe.method.kind):
        parts.append("logits of the completion tokens only (TRL's fused head)")
    if recipe.train.batching == "tokens":
        parts.append(f"token batches of {tokens_per_batch(recipe)}")
    return ", ".join(parts)


def _auto_micro_batch(config, recipe, knobs: Knobs, world, per_node, precision, gpu_memory_bytes) -> Knobs:
    if not gpu_memory_bytes:
        return knobs
    budget = gpu_memory_bytes * min(USABLE_FRACTION, 1 - recipe.train.memory_headroom)
    size = 2
    while size <= recipe.train.max_micro_batch:
        bigger = dataclasses.replace(knobs, micro_batch=size)
        if _memory(config, recipe, bigger, world, per_node, precision)[2].total > budget:
            break
        knobs, size = bigger, size * 2
    return knobs


def _join_or(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def _micro_batch_text(est: Estimate) -> str:
    return f"auto ({est.micro_batch} by this estimate; the run probes)" if est.micro_batch_auto else str(est.micro_batch)


ZERO_FORMULAS = {0: "16P", 1: "4P + 12P/N", 2: "2P + 14P/N", 3: "16P/N"}


def format_pipeline(info: dict) -> list[str]:
    """The split, bubble and per-stage memory of a pipeline run (tuiapp.core.plan.pipeline_plan.plan)."""
    rows = [f"pipeline     {info['stages']} stages x {info['replicas']} replica(s), {info['microbatches']} "
            f"micro-batches of {info['microbatch_size']}, {info['schedule']}, bubble "
            f"(p-1)/(m+p-1) = {info['bubble']:.0%}",
            "  stage  layers      params  states GB  in flight  activations GB  total GB"]
    for s in info["per_stage"]:
        states = s["params_bytes"] + s["grads_bytes"] + s["optimizer_bytes"]
        rows.append(f"  {s['index']:>5}  {s['first_layer']:>3}-{s['last_layer'] - 1:<3} {s['params']:>11,}  "
                    f"{states / GB:>9.2f}  {s['in_flight']:>9}  {s['activations_bytes'] / GB:>14.2f}  "
                    f"{s['total_bytes'] / GB:>8.2f}")
    return rows


def format_estimate(est: Estimate) -> str:
    """A compact table with one decimal: in GB, or in MB when the total is under 1 GB (a small
    model's rows all read 0.0 GB)."""
    m = est.memory
    unit, unit_name = (GB, "GB") if m.total >= GB else (1e6, "MB")
    gpus = plural(est.n_gpus, "CPU rank" if est.cpu else "GPU") + (f" x {est.nodes} nodes" if est.nodes > 1 else "")
    if est.nodes > 1 or (est.world_size and est.world_size != est.n_gpus):
        gpus += f" (world size {est.world_size or est.n_gpus * est.nodes})"
    rows = [
        f"model        {est.model}: {_count(est.total_params)} params"
        + (f" ({_count(est.active_params)} active per token)" if est.active_params else "") + ", "
        f"{_count(est.trainable_params)} trainable ({est.method})",
        f"setup        {gpus}, ZeRO-{est.zero_stage}, {est.precision}, micro_batch {_micro_batch_text(est)} x "
        f"{est.seq_len} tokens, checkpointing {'on' if est.gradient_checkpointing else 'off'}"
        + (f", {est.kernels}" if est.kernels else ""),
        f"per rank         {unit_name}" if est.cpu else f"per GPU          {unit_name}",
    ]
    for name in ("params", "grads", "optimizer"):
        rows.append(f"  {name:<12} {getattr(m, name) / unit:>6.1f}" + (f"  {est.optimizer}" if name == "optimizer" else ""))
    states = f"  {'model states':<12} {m.model_states / unit:>6.1f}"
    full = est.trainable_params == est.total_params and est.precision != "fp32" and not m.cpu_offload_total \
        and est.optimizer == "adamw"  # the ZeRO paper's K = 12 is Adam's
    if full:  # the ZeRO paper's mixed-precision Adam, P parameters over N ranks
        states += f"  ZeRO-{est.zero_stage}: {ZERO_FORMULAS[est.zero_stage]}, N = {est.world_size or est.n_gpus * est.nodes}"
    rows.append(states)
    for name in ("buffers", "activations") + (("reference",) if m.reference else ()):
        rows.append(f"  {name:<12} {getattr(m, name) / unit:>6.1f}")
    if m.teacher_pass:
        rows.append(f"  {'teacher':<12} {m.teacher_pass / unit:>6.1f}  alone, before training (its top-k pass)")
    total = f"  {'total':<12} {m.total / unit:>6.1f}" + ("  (the teacher's pass)" if m.teacher_pass > m.training else "")
    if est.gpu_memory_bytes:
        total += f"  of {est.gpu_memory_bytes / GB:.1f} GB: {'fits' if est.fits else 'does NOT fit'}"
    rows.append(total)
    if est.generation_share:
        of_gpu = f" ({est.gpu_memory_bytes * est.generation_share / GB:.1f} GB)" if est.gpu_memory_bytes else ""
        rows.append(f"  {'+ vLLM':<12} {est.generation_share:>6.0%}  of each GPU{of_gpu}: its weights and KV cache, "
                    "beside the training (method.vllm_gpu_memory_utilization)")
    if est.server_gpus:
        weights = est.total_params * 2 / est.server_gpus  # vLLM serves in 16 bits
        rows.append(f"  {'+ vLLM':<12} {plural(est.server_gpus, 'GPU')} of its own besides the ranks' "
                    "(method.vllm_server_gpus): "
                    f"{weights / GB:.1f} GB of weights each, {est.server_share:.0%} of each GPU with its KV cache")
    if est.vision:
        rows.append(_vision_row(est.vision))
    rows += _ram_rows(est)
    if est.teacher_cache:  # distill offline: written once before training, kept in the cache
        from tuiapp.core.plan.distill import teacher_cache_text

        rows.append(teacher_cache_text(est.teacher_cache))
    if m.cpu_offload_total:
        rows.append(f"CPU offload  {m.cpu_offload_total / GB:.1f} GB per node")
    if est.pipeline:
        rows += format_pipeline(est.pipeline)
    if est.longest:  # train.sequence_parallel: the longest sequence per degree
        rows.append("longest sequence that fits: " + ", ".join(
            f"degree {n}: {seq:,} tokens" if seq else f"degree {n}: none" for n, seq in est.longest))
    if est.warning:
        rows.append(f"warning: {est.warning}")
    return "\n".join(rows)


# ---------------------------------------------------------------- configs


def _cached_config(hub_id: str, cache_dir: str | Path | None = None) -> Path | None:
    """config.json of `hub_id` at 'main' in the HF cache (huggingface_hub's own lookup)."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        found = try_to_load_from_cache(hub_id, "config.json", cache_dir=cache_dir)
    except (HFValidationError, ValueError):
        return None
    return Path(found) if isinstance(found, str) else None


def _with_counts(config: dict, folder: Path) -> dict:
    """The config with the model profile's exact parameter counts (total, active, experts) under
    PROFILE_COUNTS, which count_parameters prefers to its formula; unchanged when no profile was
    made yet (preflight and `llmtui estimate` make it: architecture.profile_of)."""
    profile = model_profile.cached_profile(folder)
    counts = profile.data.get("parameters") if profile is not None else None
    return {**config, PROFILE_COUNTS: counts} if counts else config


def _read_config(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RecipeError(
            message=f"cannot read {path}: {exc}", key="model.name",
            fix="point model.name at a folder with a valid HF config.json",
        ) from None


def adapter_base(folder: Path) -> str | None:
    """The base model the trainer loads under an adapter folder (an earlier run's final/):
    peft's adapter_config.json names it; the bottleneck adapter's is in llmtui.json."""
    for name, key in (("adapter_config.json", "base_model_name_or_path"), (rundir.FINAL_INFO, "base_model")):
        try:
            value = json.loads((folder / name).read_text(encoding="utf-8")).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if value:
            return str(value)
    return None


def load_model_config(name: str, base_dir: str | Path | None = None, *,
                      cache_dir: str | Path | None = None, _follow: bool = True) -> dict:
    """The HF config dict of `name`: 'tiny', a local folder or config.json (relative to
    `base_dir`), an adapter folder (its base model's config), a hub id found in the HF cache
    (`cache_dir`, default huggingface_hub's), or an offline preset (PRESET_CONFIGS).
    'run:NAME' must be resolved to a folder by the caller."""
    if name == "tiny":
        return dict(TINY_CONFIG)
    from tuiapp.core.plan.distill import STUDENT_NAME, student_config

    if name == STUDENT_NAME:  # the bundled distillation student
        return student_config(TINY_CONFIG)
    if tiny_vlm.is_tiny_vlm(name):
        return tiny_vlm.estimate_config(name)
    local = Path(name).expanduser()
    if base_dir is not None and not local.is_absolute():
        local = Path(base_dir) / local
    if local.is_dir() and (local / "config.json").is_file():
        return _with_counts(_read_config(local / "config.json"), local)
    if local.is_file() and local.name.endswith(".json"):
        return _read_config(local)
    base = adapter_base(local) if local.is_dir() and _follow else None
    if base:
        return load_model_config(base, base_dir, cache_dir=cache_dir, _follow=False)
    if not name.startswith("run:") and not local.exists():
        cached = _cached_config(name, cache_dir)
        if cached:
            return _with_counts(_read_config(cached), cached.parent)
    if name in PRESET_CONFIGS:
        return dict(PRESET_CONFIGS[name])
    raise RecipeError(
        message=f"no config.json found for '{name}'",
        key="model.name",
        fix="download the model first (hf download " + name + "), point model.name at a local "
        "folder with config.json, or use 'tiny' or one of the offline presets: "
        + ", ".join(PRESET_CONFIGS),
    )
