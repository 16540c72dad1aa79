"""Loading the base model and tokenizer, and applying the recipe's training method."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tuiapp.core.common.errors import RecipeError
from tuiapp.core.common.methods import from_config, is_full, is_lora, is_quantized, mergeable, peft_of, trains_on_text
from tuiapp.core.config.recipe import Recipe
from tuiapp.core.plan.estimate import adapter_base
from tuiapp.core.plan.model_profile import ModelPlan, ModelProfile, plan_model, raise_for_errors
from tuiapp.core.run_folder.rundir import FINAL_INFO
from tuiapp.trainer.models import bottleneck, moe, templates, torch_varlen, varlen
from tuiapp.trainer.models.profile import profile
from tuiapp.trainer.models.tiny import default_cache_dir  # noqa: F401 (re-exported)


def final_info(folder: Path) -> dict:
    """A final model's llmtui.json: what trained it and from which base ({} for a folder without one)."""
    return json.loads((folder / FINAL_INFO).read_text()) if (folder / FINAL_INFO).exists() else {}


def keep_sentencepiece(folder: Path, *sources) -> None:
    """The SentencePiece model a tokenizer was loaded from, copied into `folder` (a final model, an
    export) when its save left it out: transformers 5 writes tokenizer.json alone, and llama.cpp's
    converter reads Gemma's vocabulary from tokenizer.model only."""
    import shutil

    from tuiapp.core.after.gguf_tools import SENTENCEPIECE_MODEL

    folder = Path(folder)
    if (folder / SENTENCEPIECE_MODEL).exists():
        return
    for source in sources:
        if source and (Path(source) / SENTENCEPIECE_MODEL).is_file():
            shutil.copy2(Path(source) / SENTENCEPIECE_MODEL, folder / SENTENCEPIECE_MODEL)
            return


def cache_dir() -> Path:
    return default_cache_dir()


def torch_dtype(precision: str) -> torch.dtype:
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}.get(precision, torch.float32)


def load_tokenizer(path: str, trust_remote_code: bool, recipe: Recipe | None = None):
    """The tokenizer, with a pad token (EOS when it has none) and the recipe's dataset.template."""
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if recipe is not None and not trains_on_text(recipe.method.kind):
        templates.apply_template(tokenizer, recipe.dataset.template, recipe.model.name)
    return tokenizer


_profiles: dict[tuple[str, bool], ModelProfile | None] = {}


def model_profile(path: str, trust_remote_code: bool) -> ModelProfile | None:
    """The profile of the model at `path` (an adapter folder: its base), read once per process;
    None when the model cannot be built on the meta device (some remote code), as preflight warned."""
    key = (path, trust_remote_code)
    if key not in _profiles:
        folder = Path(path)
        adapter = (folder / "adapter_config.json").exists() or (folder / bottleneck.CONFIG_NAME).exists()
        base = adapter_base(folder) if adapter else None
        try:
            _profiles[key] = ModelProfile(profile(base or path, trust_remote_code=trust_remote_code))
        except Exception as exc:  # noqa: BLE001 - the recipe's own settings apply, as before profiles
            print(f"llmtui: no model profile ({type(exc).__name__}: {exc}); the recipe's settings apply as written",
                  file=sys.stderr)
            _profiles[key] = None
    return _profiles[key]


def model_plan(recipe: Recipe, path: str, precision: str = "fp32") -> ModelPlan:
    """plan_model on this model, as preflight decided it: attention, adapter targets. Stops the run
    on what preflight refuses (a recipe launched without preflight)."""
    profile_ = model_profile(path, recipe.model.trust_remote_code)
    if profile_ is None:
        ia3 = recipe.method.target_modules if peft_of(recipe.method.kind) == "ia3" and \
            recipe.method.target_modules != "auto" else None
        adapter = recipe.method if is_lora(recipe.method.kind) else \
            getattr(recipe.method, "adapter", None)
        return ModelPlan(attention=attn_implementation(recipe.model.attn_implementation, precision),
                         lora_targets=adapter.target_modules if adapter is not None else "all-linear",
                         ia3_targets=ia3)
    plan = plan_model(profile_, recipe, cuda=torch.cuda.is_available(),
                      flash_installed=importlib.util.find_spec("flash_attn") is not None, precision=precision,
                      varlen_kernel=torch_varlen.available())
    raise_for_errors(plan)
    plan.kernels["liger"] = ("Liger's fused RMSNorm, RoPE, SwiGLU and linear cross-entropy"
                             if recipe.train.liger_kernel else "off")
    return plan


def _merge_adapter_folder(path: str, dtype, trust_remote_code: bool):
    """An earlier run's adapter folder: load its base, apply and merge the adapter."""
    folder = Path(path)
    info = final_info(folder)
    base = info.get("base_model")
    if (folder / bottleneck.CONFIG_NAME).exists():
        model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype, trust_remote_code=trust_remote_code)
        return bottleneck.load_bottleneck(model, folder)
    from peft import AutoPeftModelForCausalLM

    model = AutoPeftModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code)
    if not hasattr(model, "merge_and_unload") or not mergeable(info.get("method")):
        raise RecipeError(
            message=f"cannot continue from a {info.get('method')} adapter: it cannot be merged into its base",
            key="model.name",
            fix="start from that run's base model, or from a lora/dora/ia3/sft run",
        )
    return model.merge_and_unload()


def attn_implementation(requested: str, precision: str, cuda: bool | None = None) -> str:
    """model.attn_implementation resolved: 'auto' = flash_attention_2 where it can run (CUDA, the
    flash_attn package, half precision), so packed batches take its variable-length path; else sdpa."""
    if cuda is None:
        cuda = torch.cuda.is_available()
    if requested == "flash_attention_2" and not cuda:
        raise RecipeError(message="flash_attention_2 needs a CUDA GPU", key="model.attn_implementation",
                          fix="set model.attn_implementation = 'auto' or 'sdpa'")
    if requested != "auto":
        return requested
    if cuda and precision in ("bf16", "fp16") and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def load_model(recipe: Recipe, path: str, precision: str):
    """The model to train. Its forward makes no KV cache: with one, transformers does not keep
    the examples of a packed row apart, and each attends to those before it."""
    varlen.install()  # sdpa runs a flattened row of packed examples one example at a time
    torch_varlen.install()  # torch's varlen kernels on packed rows (model_plan picks them on CUDA)
    model = _load_model(recipe, path, precision)
    model.config.use_cache = False
    profile_ = model_profile(path, recipe.model.trust_remote_code)  # expert counts under every family's name
    moe.name_experts(model.config, profile_.moe if profile_ is not None else None)
    varlen.skip_packed_mask(model)  # and without the mask over the row that no layer reads
    torch_varlen.mark_packed_rows(model)
    return model


def _load_model(recipe: Recipe, path: str, precision: str):
    trust = recipe.model.trust_remote_code
    dtype = torch_dtype(precision) if recipe.model.dtype == "auto" else getattr(torch, recipe.model.dtype)
    method = recipe.method
    attn_implementation(recipe.model.attn_implementation, precision)  # flash_attention_2 without CUDA stops here
    plan = model_plan(recipe, path, precision)
    attention = plan.attention
    extra = _moe_settings(recipe)
    if recipe.model.rope_scaling is not None or recipe.model.max_position_embeddings:  # long context
        from tuiapp.trainer.models.long_context import rope_overrides

        extra.setdefault("config", {}).update(rope_overrides(recipe, AutoConfig.from_pretrained(path,
                                                                                                trust_remote_code=trust)))
    if from_config(method.kind):
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust)
        if method.hidden_size:
            config.hidden_size = method.hidden_size
        if method.num_layers:
            config.num_hidden_layers = method.num_layers
        torch.manual_seed(recipe.train.seed)
        for name, value in extra.pop("config", {}).items():
            setattr(config, name, value)
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust, attn_implementation=attention,
                                                **extra)
    if (Path(path) / "adapter_config.json").exists() or (Path(path) / bottleneck.CONFIG_NAME).exists():
        return _merge_adapter_folder(path, dtype, trust)
    kwargs = {"dtype": dtype, "trust_remote_code": trust, "attn_implementation": attention, **extra.pop("config", {}),
              **extra}
    if is_quantized(method.kind):
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=method.quant_type,
            bnb_4bit_use_double_quant=method.double_quant,
            bnb_4bit_compute_dtype=dtype if dtype != torch.float32 else torch.bfloat16,
        )
        kwargs["device_map"] = {"": int(os.environ.get("LOCAL_RANK", 0))}
    # keep master weights in fp32 for full fine-tunes; DeepSpeed casts for mixed precision
    if is_full(method.kind):  # pretrain returned above
        kwargs["dtype"] = torch.float32
    return AutoModelForCausalLM.from_pretrained(path, **kwargs)


def _moe_settings(recipe: Recipe) -> dict:
    """from_pretrained/from_config arguments of the mixture-of-experts keys (config values under 'config')."""
    out: dict = {}
    if recipe.model.experts_implementation != "auto":
        out["experts_implementation"] = recipe.model.experts_implementation
    if recipe.model.router_aux_loss_coef is not None:
        out["config"] = {"output_router_logits": True, "router_aux_loss_coef": recipe.model.router_aux_loss_coef}
    return out


def count_parameters(model) -> tuple[int, int]:
    total = trainable = 0
    for param in model.parameters():
        n = param.ds_numel if hasattr(param, "ds_numel") else param.numel()
        total += n
        if param.requires_grad:
            trainable += n
    return total, trainable
