"""The adapter methods' builders: one per kind of the adapter family (core/common/methods.py), each
wrapping the loaded base in its adapter (peft's configs; the bottleneck adapter is llmtui's own).
A new adapter kind adds its row to the method table and its builder to BUILDERS below;
tests/trainer/test_adapter_builders.py fails while one is missing."""

from __future__ import annotations

from collections.abc import Callable

from tuiapp.core.common.methods import has_magnitudes, is_full, is_quantized
from tuiapp.core.config.recipe import Recipe
from tuiapp.trainer.models import bottleneck
from tuiapp.trainer.models.model import model_plan


def lora_config(method, task: str = "CAUSAL_LM", targets: list[str] | str | None = None):
    """peft's LoraConfig of a lora/qlora/dora method model (also a preference method's adapter);
    `targets` as the model plan chose them (method.target_modules unless the architecture needs others)."""
    import peft

    return peft.LoraConfig(
        task_type=getattr(peft.TaskType, task),
        r=method.rank,
        lora_alpha=method.alpha,
        lora_dropout=method.dropout,
        target_modules=method.target_modules if targets is None else targets,
        use_dora=has_magnitudes(method.kind),
    )


def _lora(model, recipe: Recipe, tokenizer_path: str):
    import peft

    if is_quantized(recipe.method.kind):
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=recipe.train.gradient_checkpointing)
    return model, lora_config(recipe.method, targets=model_plan(recipe, tokenizer_path).lora_targets)


def _prefix(model, recipe: Recipe, tokenizer_path: str):
    import peft

    method = recipe.method
    return model, peft.PrefixTuningConfig(task_type=peft.TaskType.CAUSAL_LM, num_virtual_tokens=method.virtual_tokens,
                                          prefix_projection=method.projection,
                                          encoder_hidden_size=method.encoder_hidden_size)


def _prompt(model, recipe: Recipe, tokenizer_path: str):
    import peft

    method, extra = recipe.method, {}
    if method.init_text:
        extra = dict(prompt_tuning_init=peft.PromptTuningInit.TEXT, prompt_tuning_init_text=method.init_text,
                     tokenizer_name_or_path=tokenizer_path)
    return model, peft.PromptTuningConfig(task_type=peft.TaskType.CAUSAL_LM, num_virtual_tokens=method.virtual_tokens,
                                          **extra)


def _ptuning(model, recipe: Recipe, tokenizer_path: str):
    import peft

    method = recipe.method
    return model, peft.PromptEncoderConfig(task_type=peft.TaskType.CAUSAL_LM, num_virtual_tokens=method.virtual_tokens,
                                           encoder_reparameterization_type=method.encoder_type,
                                           encoder_hidden_size=method.encoder_hidden_size)


def _ia3(model, recipe: Recipe, tokenizer_path: str):
    import peft

    plan = model_plan(recipe, tokenizer_path)
    return model, peft.IA3Config(task_type=peft.TaskType.CAUSAL_LM, target_modules=plan.ia3_targets,
                                 feedforward_modules=plan.ia3_feedforward)


def _llama_adapter(model, recipe: Recipe, tokenizer_path: str):
    import peft

    method = recipe.method
    layers = min(method.adapter_layers, model.config.num_hidden_layers)
    return model, peft.AdaptionPromptConfig(task_type=peft.TaskType.CAUSAL_LM, adapter_len=method.adapter_len,
                                            adapter_layers=layers)


def _bottleneck(model, recipe: Recipe, tokenizer_path: str):
    return bottleneck.add_bottleneck_adapters(model, recipe.method.bottleneck_size, recipe.method.dropout), None


BUILDERS: dict[str, Callable] = {
    "lora": _lora,
    "qlora": _lora,
    "dora": _lora,
    "prefix": _prefix,
    "prompt": _prompt,
    "ptuning": _ptuning,
    "ia3": _ia3,
    "adapter": _bottleneck,
    "llama-adapter": _llama_adapter,
}
"""kind -> (model, recipe, tokenizer path) -> (the model to wrap, its peft config; None: already wrapped)."""


def apply_method(model, recipe: Recipe, tokenizer_path: str):
    """Wrap the model for the recipe's method; returns the model to train (every weight: the model)."""
    if is_full(recipe.method.kind):
        return model
    model, config = BUILDERS[recipe.method.kind](model, recipe, tokenizer_path)
    if config is None:
        return model
    import peft

    return peft.get_peft_model(model, config)
