"""Logits only where the loss is taken.

In SFT the prompt's positions carry the label -100, yet a causal LM projects every position onto
the vocabulary and upcasts those logits for the loss. Here a training batch asks the model for the
logits of the trained positions only (transformers' boolean `logits_to_keep`) and hands the loss
their labels, already shifted (`shift_labels`). The loss is the same sum over the same tokens; the
lm_head's work and the logits' memory shrink by the prompts' share of the batch.

Used where the model's own forward takes a boolean `logits_to_keep` and the method adds no virtual
tokens in front of the sequence (prefix, prompt and p-tuning shift the positions).
"""

from __future__ import annotations

import inspect

import torch.nn.functional as F

from tuiapp.core.common.methods import is_virtual_tokens, trains_on_text
from tuiapp.trainer.dataset.packing import IGNORE


def applies(model, method_kind: str, fused_loss: bool) -> bool:
    """Whether training batches of this model may keep only the trained positions' logits."""
    if is_virtual_tokens(method_kind) or trains_on_text(method_kind) or fused_loss:
        return False  # pretrain trains every position; a fused loss (Liger) holds no logits anyway
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not type(base).__module__.startswith("transformers.models."):
        return False  # remote code: its forward may slice logits_to_keep the old way
    try:
        return "logits_to_keep" in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False


def narrowed(inputs: dict) -> dict:
    """The batch with `logits_to_keep` (positions whose next label is trained) and those labels."""
    labels = inputs.get("labels")
    if labels is None or labels.dim() != 2 or "logits_to_keep" in inputs or "shift_labels" in inputs:
        return inputs
    shifted = F.pad(labels, (0, 1), value=IGNORE)[..., 1:]
    keep = shifted != IGNORE
    return {**inputs, "logits_to_keep": keep, "shift_labels": shifted[keep]}

