"""Preference tuning on TRL's trainers: dpo, kto and reward (trl), simpo/cpo and orpo (trl.experimental).

The data arrive tokenized by `tuiapp.trainer.dataset.data` (one cache and one chat-template/masking path
for every method): pairs as prompt_ids + chosen_ids + rejected_ids, feedback as prompt_ids +
completion_ids + label. Each trainer is subclassed only to take them as they are (TRL would
otherwise tokenize again), to stay quiet (no telemetry, no model card) and to count tokens.

The reference model of dpo/kto: with an adapter, none (TRL disables the adapters to get the
base); with full weights, a frozen copy loaded here, which TRL prepares with the run's DeepSpeed
config (ZeRO-3 shards it, lower stages hold it whole on every rank).
"""

from __future__ import annotations

from pathlib import Path

import torch

from tuiapp.core.common.errors import RecipeError
from tuiapp.core.common.methods import METHODS, is_lora, is_quantized, is_reward_model
from tuiapp.core.config.recipe import Recipe, weights_method
from tuiapp.core.run_folder import events as ev
from tuiapp.trainer.dataset.data import IGNORE
from tuiapp.trainer.methods.adapters import lora_config
from tuiapp.trainer.models import bottleneck
from tuiapp.trainer.models.model import load_model, model_plan, torch_dtype

PAIR_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")
FEEDBACK_COLUMNS = ("prompt_ids", "completion_ids", "label")


# ---------------------------------------------------------------- models


def load_models(recipe: Recipe, path: str, precision: str):
    """(policy, frozen reference or None, peft config or None) for the recipe's method."""
    method = recipe.method
    weights = weights_method(method)
    adapter = is_lora(weights.kind)
    if is_reward_model(method.kind):
        policy = _load_reward_model(recipe, path, precision, weights)
    else:
        policy = load_model(recipe.model_copy(update={"method": weights}), path, precision)
    if is_quantized(weights.kind) and method.kind in ("dpo", "kto", "reward"):
        import peft  # cpo and orpo prepare a k-bit model themselves

        policy = peft.prepare_model_for_kbit_training(
            policy, use_gradient_checkpointing=recipe.train.gradient_checkpointing
        )
    task = "SEQ_CLS" if is_reward_model(method.kind) else "CAUSAL_LM"
    peft_config = lora_config(weights, task, targets=model_plan(recipe, path).lora_targets) if adapter else None
    reference = None
    if METHODS[method.kind].reference and not adapter:
        reference = load_model(recipe.model_copy(update={"method": weights}), path, precision)
        reference = reference.to(torch_dtype(precision)) if precision != "fp32" else reference
        reference.requires_grad_(False)
        reference.eval()
    return policy, reference, peft_config


def _load_reward_model(recipe: Recipe, path: str, precision: str, weights):
    from transformers import AutoModelForSequenceClassification

    folder = Path(path)
    if (folder / "adapter_config.json").exists() or (folder / bottleneck.CONFIG_NAME).exists():
        raise RecipeError(
            message="a reward model starts from a whole model, and model.name is an adapter folder",
            key="model.name",
            fix="merge it first (llmtui export RUN --out DIR --merge) and set model.name to DIR",
        )
    dtype = torch.float32 if weights.kind == "sft" else torch_dtype(precision)
    if recipe.model.dtype != "auto":
        dtype = getattr(torch, recipe.model.dtype)
    kwargs = {"dtype": dtype, "num_labels": 1, "trust_remote_code": recipe.model.trust_remote_code,
              "attn_implementation": model_plan(recipe, path, precision).attention}
    if weights.kind == "qlora":
        import os

        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type=weights.quant_type,
            bnb_4bit_use_double_quant=weights.double_quant,
            bnb_4bit_compute_dtype=dtype if dtype != torch.float32 else torch.bfloat16,
        )
        kwargs["device_map"] = {"": int(os.environ.get("LOCAL_RANK", 0))}
    return AutoModelForSequenceClassification.from_pretrained(path, **kwargs)


# ---------------------------------------------------------------- trainers


def trainer_config(recipe: Recipe, kwargs: dict):
    """TRL's config of the method: the run's TrainingArguments keywords + the method's keys."""
    method = recipe.method
    common = dict(kwargs, max_length=recipe.train.max_seq_len, disable_dropout=True)
    if method.kind == "dpo":
        from trl import DPOConfig

        return DPOConfig(**common, beta=method.beta, loss_type=[method.loss], label_smoothing=method.label_smoothing)
    if method.kind == "kto":
        from trl import KTOConfig

        return KTOConfig(**common, beta=method.beta, desirable_weight=method.desirable_weight,
                         undesirable_weight=method.undesirable_weight, train_sampling_strategy="sequential")
    if method.kind == "reward":
        from trl import RewardConfig

        return RewardConfig(**common, center_rewards_coefficient=method.center_rewards or None)
    if method.kind in ("simpo", "cpo"):
        from trl.experimental.cpo import CPOConfig

        loss = "simpo" if method.kind == "simpo" else method.loss
        extra = {"simpo_gamma": method.gamma} if method.kind == "simpo" else {}
        return CPOConfig(**common, beta=method.beta, loss_type=loss, cpo_alpha=method.sft_weight, **extra)
    if method.kind == "orpo":
        from trl.experimental.orpo import ORPOConfig

        return ORPOConfig(**common, beta=method.beta)
    raise ValueError(method.kind)  # pragma: no cover - the schema admits no other kind


def trainer_class(kind: str, mixins: tuple = ()):
    """The TRL trainer of a method kind, with llmtui's mixins in front and the adaptations below."""
    if kind == "dpo":
        from trl import DPOTrainer

        bases = (_Quiet, _PretokenizedPairs, DPOTrainer)
    elif kind == "kto":
        from trl import KTOTrainer

        bases = (_Quiet, _PretokenizedFeedback, KTOTrainer)
    elif kind == "reward":
        from trl import RewardTrainer

        bases = (_Quiet, _PretokenizedRewardPairs, RewardTrainer)
    elif kind in ("simpo", "cpo"):
        from trl.experimental.cpo import CPOTrainer

        bases = (_Quiet, _LegacyPairs, CPOTrainer)
    elif kind == "orpo":
        from trl.experimental.orpo import ORPOTrainer

        bases = (_Quiet, _LegacyPairs, ORPOTrainer)
    else:  # pragma: no cover
        raise ValueError(kind)
    return type(f"{kind.capitalize()}RunTrainer", (*mixins, *bases), {})


def build_trainer(recipe: Recipe, model, ref_model, peft_config, kwargs: dict, train_set, eval_set, tokenizer,
                  callbacks: list, mixins: tuple = ()):
    kind = recipe.method.kind
    _check_columns(recipe, train_set)
    if METHODS[kind].unpaired:  # TRL's KTO reads batches in order (its KL pairs are its batch neighbours): shuffle once
        train_set = train_set.shuffle(seed=recipe.train.seed).flatten_indices()
    if kind in ("simpo", "cpo", "orpo"):
        train_set = to_legacy_pairs(train_set)
        eval_set = to_legacy_pairs(eval_set) if eval_set is not None else None
    config = trainer_config(recipe, kwargs)
    cls = trainer_class(kind, mixins)
    extra = {"ref_model": ref_model} if METHODS[kind].reference else {}
    return cls(model=model, args=config, train_dataset=train_set, eval_dataset=eval_set,
               processing_class=tokenizer, callbacks=callbacks, peft_config=peft_config, **extra)


def reference_event(trainer) -> dict:
    """What the run compares against, for events.jsonl: a frozen copy (its parameters in all, and
    those this rank holds: fewer under ZeRO-3, which shards it), the base with the adapter switched
    off, or nothing (simpo, cpo, orpo, reward)."""
    kind = getattr(trainer, "method_kind", "")
    ref = getattr(trainer, "ref_model", None)
    if ref is not None:
        total = sum(getattr(p, "ds_numel", p.numel()) for p in ref.parameters())
        local = sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in ref.parameters())
        return {"event": ev.REFERENCE, "model": "frozen copy", "params": total, "params_on_rank": local}
    if kind in METHODS and METHODS[kind].reference:
        return {"event": ev.REFERENCE, "model": "the base, adapter off", "params": 0, "params_on_rank": 0}
    return {"event": ev.REFERENCE, "model": "none", "params": 0, "params_on_rank": 0}


def _check_columns(recipe: Recipe, dataset) -> None:
    """The data must be what the method trains on (pre-flight says so too, but not for hub data)."""
    wanted = FEEDBACK_COLUMNS if METHODS[recipe.method.kind].unpaired else PAIR_COLUMNS
    if all(c in dataset.column_names for c in wanted):
        return
    if METHODS[recipe.method.kind].unpaired:
        raise RecipeError(message="kto trains on single answers labelled true or false, and these records are not",
                          file=recipe.dataset.name, key="dataset.name",
                          fix="use messages/sharegpt records with a boolean 'label' (or prompt/completion/label), "
                          "or method.kind = 'dpo' for chosen/rejected pairs")
    raise RecipeError(message=f"{recipe.method.kind} trains on preference pairs, and these records have none",
                      file=recipe.dataset.name, key="dataset.name",
                      fix="use records with a prompt and 'chosen' and 'rejected' answers (demo:prefs), "
                      "or method.kind = 'kto' for labelled answers")


# ---------------------------------------------------------------- adaptations


class _Quiet:
    """No telemetry from a training rank, no model card next to the checkpoints."""

    def _send_telemetry(self):
        return None

    def create_model_card(self, *args, **kwargs):
        return None


class _PretokenizedPairs:
    """DPO: prompt_ids/chosen_ids/rejected_ids are already what its collator takes."""

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        return dataset


class _PretokenizedFeedback:
    """KTO: prompt_ids/completion_ids/label as they are, plus TRL's KL completions (each answer of a
    micro batch paired with the previous example's prompt)."""

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        if not self.calculate_KL:
            return dataset

        def rotate(batch):
            batch["KL_completion_ids"] = [batch["completion_ids"][-1]] + batch["completion_ids"][:-1]
            return batch

        return dataset.map(rotate, batched=True, batch_size=args.per_device_train_batch_size,
                           desc=f"KL completions of {dataset_name}")


class _PretokenizedRewardPairs:
    """Reward model: TRL scores whole sequences, so each answer gets its prompt in front."""

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        if "prompt_ids" not in dataset.column_names:
            return dataset

        def whole(example):
            return {"chosen_ids": example["prompt_ids"] + example["chosen_ids"],
                    "rejected_ids": example["prompt_ids"] + example["rejected_ids"]}

        return dataset.map(whole, remove_columns=["prompt_ids"], desc=f"whole sequences of {dataset_name}")


class _LegacyPairs:
    """CPO/SimPO and ORPO tokenize rows themselves (`tokenize_row`); the rows arrive in the form it
    makes (to_legacy_pairs), so it has nothing to do. Tokens are counted from both answers."""

    def tokenize_row(self, feature, model=None):
        return {}

    def _track_num_input_tokens(self, inputs):
        if "chosen_attention_mask" not in inputs:
            return super()._track_num_input_tokens(inputs)
        tokens = inputs["chosen_attention_mask"].sum() + inputs["rejected_attention_mask"].sum()
        tokens = torch.as_tensor(tokens, device=self.args.device, dtype=torch.int64)
        self.state.num_input_tokens_seen += self.accelerator.gather(tokens).sum().item()


def to_legacy_pairs(dataset):
    """prompt_ids/chosen_ids/rejected_ids → the columns of TRL's older trainers' tokenize_row:
    prompt_*, and chosen_*/rejected_* holding the whole sequence with labels -100 on the prompt."""

    def convert(example):
        prompt = example["prompt_ids"]
        out = {"prompt_input_ids": prompt, "prompt_attention_mask": [1] * len(prompt)}
        for name in ("chosen", "rejected"):
            answer = example[f"{name}_ids"]
            out[f"{name}_input_ids"] = prompt + answer
            out[f"{name}_attention_mask"] = [1] * (len(prompt) + len(answer))
            out[f"{name}_labels"] = [IGNORE] * len(prompt) + answer
        return out

    return dataset.map(convert, remove_columns=list(dataset.column_names), desc="pairs for cpo/orpo")
