"""Tiny random-weight models of real transformers architectures, for tests and the support table.

Each entry is a real `model_type` with a config shrunk to a few hundred thousand parameters,
saved with the bundled tokenizer (so every zoo model reads the same demo data). Nothing is
downloaded: the configs come from transformers itself. `ensure_zoo_model('qwen3')` builds the
folder once per cache dir, like the tiny model.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tuiapp.core.common.built_folder import build_once
from tuiapp.trainer.models.tiny import default_cache_dir, ensure_tiny_model

ZOO_VERSION = "1"
MARKER = "llmtui_zoo.json"
SEED = 0

_DECODER = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 512, "head_dim": 16}
_MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}

# model_type -> config overrides. Architectures users bring, dense and mixture-of-experts.
ZOO: dict[str, dict] = {
    "llama": dict(_DECODER),
    "qwen2": dict(_DECODER),
    "qwen3": dict(_DECODER),
    "mistral": dict(_DECODER, sliding_window=None),
    "gemma2": dict(_DECODER, query_pre_attn_scalar=16, sliding_window=64),
    "gemma3_text": dict(_DECODER, query_pre_attn_scalar=16, sliding_window=64),
    "phi3": dict(_DECODER, pad_token_id=None),
    "olmo2": dict(_DECODER),
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 512},
    "gpt_neox": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "max_position_embeddings": 512},
    "qwen3_moe": dict(_DECODER, **_MOE, decoder_sparse_step=1, mlp_only_layers=[]),
    "mixtral": dict(_DECODER, num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    "olmoe": dict(_DECODER, **{k: v for k, v in _MOE.items() if k != "moe_intermediate_size"}),
    # beyond the first zoo: layouts the rules above did not foresee (issue: packed sdpa reached another way,
    # MLA attention with fused experts, multi-query attention, num_local_experts under another name)
    "stablelm": {k: v for k, v in _DECODER.items() if k != "head_dim"},
    "deepseek_v3": dict(_DECODER, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=32, n_group=1, topk_group=1, first_k_dense_replace=1, q_lora_rank=32,
                        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, head_dim=8),
    "falcon": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "multi_query": True,
               "new_decoder_architecture": False, "ffn_hidden_size": 128, "max_position_embeddings": 512},
    "phimoe": dict(_DECODER, num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
}
# families whose pairs the dry step decides (one step on the zoo model) rather than 3-step trainings
DRY_DECIDED = frozenset({"stablelm", "deepseek_v3", "falcon", "phimoe"})


def definition_version(arch: str) -> str:
    parts = [ZOO_VERSION, SEED, arch, ZOO[arch]]
    return ZOO_VERSION + "-" + hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:10]


def ensure_zoo_model(arch: str, cache_dir: Path | str | None = None) -> Path:
    """The HF folder of the zoo model `arch`, built on first use (atomically, like the tiny model)."""
    if arch not in ZOO:
        raise KeyError(f"no zoo model '{arch}'; the zoo has {', '.join(ZOO)}")
    target = Path(cache_dir or default_cache_dir()) / "models" / f"zoo-{arch}-{definition_version(arch)}"
    return build_once(target, lambda folder: _build(arch, folder, cache_dir), lambda f: _is_complete(f, arch))


def _is_complete(folder: Path, arch: str) -> bool:
    try:
        return json.loads((folder / MARKER).read_text())["version"] == definition_version(arch)
    except (OSError, ValueError, KeyError):
        return False


def zoo_config(arch: str, vocab_size: int, eos: int, pad: int):
    from transformers import AutoConfig

    overrides = dict(ZOO[arch])
    if arch in ("gpt2", "falcon", "stablelm"):
        overrides.pop("head_dim", None)
    ids = {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": overrides.pop("pad_token_id", pad)}
    return AutoConfig.for_model(arch, vocab_size=vocab_size, **ids, **overrides)


def _build(arch: str, folder: Path, cache_dir) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tiny = ensure_tiny_model(cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    config = zoo_config(arch, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder, is_main_process=True)
    tokenizer.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    (folder / MARKER).write_text(json.dumps({"version": definition_version(arch), "parameters": params}) + "\n")


def zoo_profile(arch: str, cache_dir: Path | str | None = None) -> dict:
    """The profile of zoo model `arch` from its config alone (no weights built): what `llmtui model`
    prints for its folder."""
    from transformers import AutoTokenizer

    from tuiapp.trainer.models.profile import profile_config, tokenizer_facts

    tiny = ensure_tiny_model(cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    data = profile_config(zoo_config(arch, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id))
    data["tokenizer"] = tokenizer_facts(str(tiny), False)
    return data
