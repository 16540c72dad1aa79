"""A model's profile from its config alone: the model is built on the meta device, so no weight is
read and nothing is downloaded. Run in its own process by `llmtui model` and preflight
(`python -m tuiapp.trainer.models.profile PATH [--trust-remote-code]` prints one JSON object), and
in-process by the trainer, which decides from the same facts as preflight did.

What it reads from transformers and peft rather than from a hand-kept list: the attention
implementations the model class supports, peft's per-architecture defaults (IA3 targets, the
adaption prompt's model types), whether a sequence-classification head exists (reward models).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tuiapp.core.common import trainer_tools

# leaf-name fragments by role; a module's role also follows its parent (self_attn, attention, mlp...)
_ATTENTION_PARENTS = ("attn", "attention")
_MLP_PARENTS = ("mlp", "feed_forward", "ffn")
_ROUTER_NAMES = ("gate", "router")


def supported_attention(model_class) -> list[str]:
    """The attention implementations `model_class` declares support for, best first; eager always."""
    supported = [name for name, flag in (("flash_attention_2", "_supports_flash_attn"), ("sdpa", "_supports_sdpa"),
                                         ("flex_attention", "_supports_flex_attn"))
                 if getattr(model_class, flag, False)]
    return supported + ["eager"]


def attention_facts(config) -> dict:
    """What decides whether a varlen kernel runs this model's attention as it means: head dim,
    sliding window (where the config turns it on), attention logit softcap."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_attention_heads", None) or getattr(text, "n_head", None)
    hidden = getattr(text, "hidden_size", None) or getattr(text, "n_embd", None)
    head_dim = getattr(text, "head_dim", None) or (hidden // heads if hidden and heads else None)
    window = getattr(text, "sliding_window", None)
    if getattr(text, "use_sliding_window", True) is False:
        window = None
    softcap = getattr(text, "attn_logit_softcapping", None)
    return {"head_dim": head_dim if isinstance(head_dim, int) else None,
            "sliding_window": window if isinstance(window, int) and window > 0 else None,
            "softcap": softcap if isinstance(softcap, (int, float)) and softcap else None}


def causal_lm_class(config, trust_remote_code: bool = False):
    from transformers import AutoModelForCausalLM

    if trust_remote_code and getattr(config, "auto_map", None) and "AutoModelForCausalLM" in config.auto_map:
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        return get_class_from_dynamic_module(config.auto_map["AutoModelForCausalLM"], config._name_or_path)
    return AutoModelForCausalLM._model_mapping[type(config)]


def _role(name: str, module, is_linear: bool, moe: bool) -> str | None:
    parts = name.split(".")
    leaf, parents = parts[-1], parts[:-1]
    if name == "lm_head" or leaf == "lm_head":
        return "lm_head"
    if moe and type(module).__name__.endswith("Router") and any(p in _MLP_PARENTS for p in parents):
        return "router"  # a top-k router module holding the gate's weight
    if not is_linear:
        return None
    if any(p == "experts" for p in parents):
        return "experts"
    if moe and leaf in _ROUTER_NAMES and any(p in _MLP_PARENTS for p in parents):
        return "router"
    if any(any(a in p for a in _ATTENTION_PARENTS) for p in parents):
        return "attention"
    return "mlp"


def _moe_facts(config) -> dict | None:
    experts = next((getattr(config, k) for k in ("num_experts", "num_local_experts", "n_routed_experts")
                    if getattr(config, k, None)), None)
    active = next((getattr(config, k) for k in ("num_experts_per_tok", "top_k", "moe_topk")
                   if getattr(config, k, None)), None)
    if not experts or not active:
        return None
    return {"experts": int(experts), "active_experts": int(active),
            "router_aux_loss_coef": getattr(config, "router_aux_loss_coef", None),
            "experts_implementation": getattr(config, "_experts_implementation", None)}


def tokenizer_facts(path: str, trust_remote_code: bool) -> dict | None:
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as exc:  # a config without a tokenizer: the folder check says so
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    template = getattr(tokenizer, "chat_template", None)
    return {
        "chat_template": bool(template),
        "pad_token": tokenizer.pad_token,
        "eos_token": tokenizer.eos_token,
        "pad_is_eos": tokenizer.pad_token is not None and tokenizer.pad_token_id == tokenizer.eos_token_id,
        "size": len(tokenizer),
    }


def _peft_facts(config) -> dict:
    from peft.tuners.adaption_prompt.config import TRANSFORMERS_MODEL_CONFIG
    from peft.utils.constants import (
        TRANSFORMERS_MODELS_TO_IA3_FEEDFORWARD_MODULES_MAPPING,
        TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING,
    )

    model_type = config.model_type
    return {"llama_adapter": model_type in TRANSFORMERS_MODEL_CONFIG,
            "llama_adapter_types": sorted(TRANSFORMERS_MODEL_CONFIG),
            "ia3_targets": TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING.get(model_type),
            "ia3_feedforward": TRANSFORMERS_MODELS_TO_IA3_FEEDFORWARD_MODULES_MAPPING.get(model_type),
            "expert_names": _peft_expert_names(model_type),
            "prefix_kv_heads": _peft_prefix_heads(config)}


def _peft_expert_names(model_type: str) -> list[str]:
    """The linear names peft moves onto a mixture's fused expert parameters (its transformers v4 -> v5
    renames: DeepSeek-V3's gate_proj/up_proj/down_proj become experts.gate_up_proj/down_proj, even where
    a dense MLP or shared expert has linears of those names). peft's own table; [] where it has none."""
    try:
        from peft.utils import transformers_weight_conversion as conversion

        base = conversion._MODEL_TO_CONVERSION_PATTERN.get(model_type)
        return sorted(conversion._MOE_TARGET_MODULE_MAPPING.get(base) or {})
    except (ImportError, AttributeError):
        return []


def _peft_prefix_heads(config) -> int | None:
    """The key/value heads peft's prefix tuning gives each layer's learned past (its own reading of the
    config), to set beside the heads the attention has (kv_heads)."""
    try:
        import peft
        from peft.utils.other import _prepare_prompt_learning_config

        prefix = _prepare_prompt_learning_config(peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=1),
                                                 config)
        return int(prefix.num_attention_heads)
    except Exception:  # noqa: BLE001 - a config peft cannot read: prefix tuning is left to the dry step
        return None


def _kv_layout(config) -> dict:
    """Attention heads under the names families give them: query heads, key/value heads (grouped or
    multi-query), and whether keys and values come from a compressed latent (MLA, DeepSeek)."""
    heads = next((getattr(config, k) for k in ("num_attention_heads", "n_head", "num_heads")
                  if isinstance(getattr(config, k, None), int)), None)
    kv = next((getattr(config, k) for k in ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
               if isinstance(getattr(config, k, None), int)), None)
    if getattr(config, "multi_query", False) and not getattr(config, "new_decoder_architecture", False):
        kv = 1  # Falcon's multi-query attention names no key/value head count
    return {"heads": heads, "kv_heads": kv or heads, "latent": bool(getattr(config, "kv_lora_rank", None))}


def profile_config(config, *, trust_remote_code: bool = False) -> dict:
    """The profile of a model config (no tokenizer facts): built on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM, PretrainedConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

    assert isinstance(config, PretrainedConfig)
    model_class = causal_lm_class(config, trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    moe = _moe_facts(config)
    roles = _module_roles(model, moe)
    expert_params = sum(param.numel() for name, param in model.named_parameters() if ".experts." in f".{name}")
    embeddings = model.get_input_embeddings()
    output = model.get_output_embeddings()
    tied = output is not None and embeddings is not None and output.weight is embeddings.weight
    if embeddings is not None:
        _add(roles, "embedding", _leaf_of(model, embeddings))
    total = sum(p.numel() for p in model.parameters())
    active = total
    if moe and expert_params:
        active = total - expert_params + expert_params * moe["active_experts"] // moe["experts"]
    rope = getattr(config, "rope_scaling", None) or None
    if isinstance(rope, dict) and rope.get("rope_type") in (None, "default"):
        rope = None
    return {
        "model_type": config.model_type,
        "architecture": model_class.__name__,
        "parameters": {"total": total, "active": active, "experts": expert_params,
                       "embedding": embeddings.weight.numel() if embeddings is not None else 0},
        "layers": getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None),
        "hidden_size": getattr(config, "hidden_size", None) or getattr(config, "n_embd", None),
        "vocab_size": getattr(config, "vocab_size", None),
        "context_length": getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None),
        "rope_scaling": rope,
        "tied_embeddings": tied,
        "dtype": str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "").replace("torch.", "")
        or None,
        "roles": roles,
        "moe": moe,
        "attention": supported_attention(model_class),
        "attention_facts": attention_facts(config),
        "sequence_classification": config.model_type in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
        "peft": _peft_facts(config),
        "kv": _kv_layout(config),
    }

def _module_roles(model, moe: dict | None) -> dict[str, list[str]]:
    """Each module role (attention, mlp, experts, lm_head, ...) with the leaf names that play it."""
    import torch
    from transformers.pytorch_utils import Conv1D

    roles: dict[str, list[str]] = {}
    for name, module in model.named_modules():
        role = _role(name, module, isinstance(module, (torch.nn.Linear, Conv1D)), moe is not None)
        if role is None and moe is not None and name.split(".")[-1] == "experts":
            own = list(module.named_parameters(recurse=False))
            if own:  # fused expert weights (a 3-D parameter per projection), as transformers 5 builds them
                for pname, _ in own:
                    _add(roles, "experts", f"experts.{pname}")
        if role and role != "lm_head":
            _add(roles, role, name.split(".")[-1])
        elif role == "lm_head":
            _add(roles, "lm_head", "lm_head")
    return roles


def _add(roles: dict[str, list[str]], role: str, leaf: str) -> None:
    names = roles.setdefault(role, [])
    if leaf not in names:
        names.append(leaf)


def _leaf_of(model, module) -> str:
    return next((name.split(".")[-1] for name, m in model.named_modules() if m is module), "embed_tokens")


def profile(path: str, *, trust_remote_code: bool = False) -> dict:
    """The profile of the model folder (or cached hub id) `path`, tokenizer facts included."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    out = profile_config(config, trust_remote_code=trust_remote_code)
    out["tokenizer"] = tokenizer_facts(path, trust_remote_code)
    return out


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    trust = "--trust-remote-code" in args
    paths = [a for a in args if not a.startswith("--")]
    if len(paths) != 1:
        print(f"usage: {trainer_tools.prog('profile')} PATH [--trust-remote-code]", file=sys.stderr)
        return 2
    import io
    import os
    from contextlib import redirect_stdout

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    captured = io.StringIO()
    try:
        with redirect_stdout(captured):  # library chatter must not mix with the JSON answer
            from tuiapp.trainer.models.bundled import resolve_model_path

            result = profile(resolve_model_path(str(Path(paths[0]).expanduser())), trust_remote_code=trust)
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
