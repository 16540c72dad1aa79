"""One pipeline stage of a Llama-family decoder (Llama, Mistral, Qwen2/3, the tiny model): a slice of
its decoder layers, with the embeddings on the first stage and the final norm + head on the last.

The split comes from tuiapp.core.plan.pipeline_plan.split_layers (balanced by parameter count), so the
estimate shows what runs. Each stage computes its own position ids, rotary embeddings and causal
mask from the hidden states it receives, so only activations travel between stages. Batches are
right-padded, so a plain causal mask gives the padded rows the same result as an attention mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.masking_utils import create_causal_mask

from tuiapp.core.plan.pipeline_plan import Stage, split_layers
from tuiapp.trainer.dataset.packing import IGNORE


class DecoderStage(nn.Module):
    """Layers [first, last) of `model` (a *ForCausalLM with .model.layers), plus the embeddings on the
    first stage and norm + lm_head on the last. Layers keep their index as their name, so the
    stage's state dict maps to the whole model's by a prefix (`hf_state_dict`)."""

    def __init__(self, model: nn.Module, stage: Stage, stages: int):
        super().__init__()
        base = model.model
        self.config = model.config
        self.is_first, self.is_last = stage.index == 0, stage.index == stages - 1
        self.embed_tokens = base.embed_tokens if self.is_first else None
        self.layers = nn.ModuleDict({str(i): base.layers[i] for i in range(stage.first_layer, stage.last_layer)})
        self.rotary_emb = base.rotary_emb
        self.norm = base.norm if self.is_last else None
        self.lm_head = model.lm_head if self.is_last else None
        self.autocast: torch.dtype | None = None  # bf16 on CUDA: fp32 master weights, bf16 compute

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=inputs.device.type, dtype=self.autocast or torch.bfloat16,
                            enabled=self.autocast is not None):
            return self._forward(inputs)

    def _forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(inputs) if self.is_first else inputs
        position_ids = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        mask = create_causal_mask(config=self.config, inputs_embeds=hidden, attention_mask=None,
                                  past_key_values=None, position_ids=position_ids)
        position_embeddings = self.rotary_emb(hidden, position_ids=position_ids)
        for layer in self.layers.values():
            hidden = layer(hidden, attention_mask=mask, position_embeddings=position_embeddings,
                           position_ids=position_ids)
        if not self.is_last:
            return hidden
        return self.lm_head(self.norm(hidden))


def cut(model: nn.Module, stages: int, index: int) -> DecoderStage:
    """Stage `index` of `stages`, cut from a whole model by `split_layers` of its config."""
    plan = split_layers(model.config.to_dict(), stages)
    return DecoderStage(model, plan[index], stages)


def hf_name(stage_key: str) -> str:
    return stage_key if stage_key.startswith("lm_head.") else "model." + stage_key


def hf_state_dict(stage: DecoderStage) -> dict[str, torch.Tensor]:
    """The stage's weights under the whole model's names (model.layers.7...., lm_head.weight)."""
    return {hf_name(k): v.detach().cpu().contiguous() for k, v in stage.state_dict().items()}


def load_hf_state_dict(stage: DecoderStage, tensors: dict[str, torch.Tensor]) -> None:
    own = {k: hf_name(k) for k in stage.state_dict()}
    missing = [name for name in own.values() if name not in tensors]
    if missing:
        raise RuntimeError(f"the checkpoint lacks {len(missing)} weights of this stage (e.g. {missing[0]}): it "
                           "was saved with another split; resume with the same launch.pipeline_stages")
    stage.load_state_dict({k: tensors[name] for k, name in own.items()})


def tied_head(stage: DecoderStage) -> nn.Parameter | None:
    """The tied embedding matrix this stage holds (embeddings on the first stage, head on the last)."""
    if not getattr(stage.config, "tie_word_embeddings", False):
        return None
    if stage.is_first:
        return stage.embed_tokens.weight
    if stage.is_last:
        return stage.lm_head.weight
    return None


class CausalLoss:
    """HF's causal-LM loss: labels shifted by one, -100 ignored, summed and divided by the tokens of
    the whole step (every micro-batch and replica, `scale` = 1 / tokens), so the micro-batch losses
    add up to the token-weighted mean of the step, as the Trainer's num_items_in_batch makes it."""

    def __init__(self):
        self.scale = 1.0

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = logits[:, :-1].float()
        labels = labels[:, 1:].to(logits.device)
        total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE,
                                reduction="sum")
        return total * self.scale
