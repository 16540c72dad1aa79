"""Long context inside the ranks: sequence parallelism (DeepSpeed Ulysses through accelerate's
ParallelismConfig), tiled MLP, tiled logits and loss, activation offload and RoPE scaling.

Sequence parallelism (`train.sequence_parallel = N`): transformers' Trainer and accelerate 1.15 wire
DeepSpeed's ALST when TrainingArguments carry `ParallelismConfig(sp_backend="deepspeed", sp_size=N)`:
`UlyssesSPAttentionHF.register_with_transformers` wraps the model's own attention function (all-to-all
of heads: each rank attends over the whole sequence for 1/N of the heads), `UlyssesSPDataLoaderAdapter`
gives each rank of a group 1/N of every sequence (the group's ranks take turns: N micro batches per
rank cover the N sequences the group drew), and the loss is the token-weighted mean over the group.

What this module adds around it:
- `SequenceParallelCollator`: every batch carries position_ids (the adapter requires them: each shard
  keeps its tokens' global positions, and packed examples restart at 0), its length padded to a
  multiple of N (padding gets label -100 and no attention from real tokens: attention is causal), and
  no 1-D flash-attention boundary tensors (the adapter shards every tensor along dimension 1).
- `boundaries_from_positions`: after the all-to-all the attention function sees the whole sequence's
  position_ids; a packed row's example boundaries are taken from where they restart, so sdpa (per
  example, varlen.py) keeps the examples apart as it does without sequence parallelism.
"""

from __future__ import annotations

import math

import torch

from tuiapp.core.config.recipe import Recipe

DROPPED_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")


def degree(recipe: Recipe) -> int:
    return int(getattr(recipe.train, "sequence_parallel", 1) or 1)


def training_kwargs(recipe: Recipe, attn_implementation: str) -> dict:
    """TrainingArguments keywords of sequence parallelism (none at degree 1)."""
    n = degree(recipe)
    if n <= 1:
        return {}
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils.dataclasses import DeepSpeedSequenceParallelConfig

    handler = DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=True,
                                              sp_attn_implementation=attn_implementation)
    return {"parallelism_config": ParallelismConfig(sp_backend="deepspeed", sp_size=n, sp_handler=handler)}


class SequenceParallelCollator:
    """Wraps a run's collator: position_ids always, length a multiple of `n`, no 1-D tensors."""

    def __init__(self, base, n: int, pad_token_id: int, fixed_length: int = 0):
        self.base, self.n, self.pad = base, n, pad_token_id if pad_token_id is not None else 0
        self.fixed_length = fixed_length  # gloo gathers only equal shapes: every batch padded to this

    def __call__(self, features: list[dict]) -> dict:
        batch = dict(self.base(features))
        for key in DROPPED_KEYS:
            batch.pop(key, None)
        ids = batch["input_ids"]
        rows, length = ids.shape
        if "position_ids" not in batch:
            batch["position_ids"] = torch.arange(length).unsqueeze(0).expand(rows, length).contiguous()
        extra = -length % self.n
        if self.fixed_length > length:
            extra = self.fixed_length + (-self.fixed_length % self.n) - length
        if extra:
            last = batch["position_ids"][:, -1:]
            fill = {"input_ids": torch.full((rows, extra), self.pad, dtype=ids.dtype),
                    "labels": torch.full((rows, extra), -100, dtype=batch["labels"].dtype),
                    "position_ids": last + torch.arange(1, extra + 1).unsqueeze(0)}
            if "attention_mask" in batch:
                fill["attention_mask"] = torch.zeros((rows, extra), dtype=batch["attention_mask"].dtype)
            for key, tail in fill.items():
                batch[key] = torch.cat([batch[key], tail.to(batch[key].dtype)], dim=1)
        return batch


def boundaries_from_positions(attention):
    """An attention function that, given a single packed row whose position_ids restart, passes its
    example boundaries on as cu_seq_lens_q/k (what varlen.sdpa_per_example and flash-attention read)."""

    def attend(module, query, key, value, attention_mask, *args, **kwargs):
        positions = kwargs.get("position_ids")
        if (positions is not None and kwargs.get("cu_seq_lens_q") is None and query.shape[0] == 1
                and positions.shape[-1] == query.shape[2] == key.shape[2]):
            starts = (positions.reshape(-1) == 0).nonzero().reshape(-1)
            if starts.numel() > 1 or (starts.numel() == 1 and int(starts[0]) != 0):
                bounds = torch.cat([starts.new_zeros(1), starts[starts > 0],
                                    starts.new_tensor([query.shape[2]])]).to(torch.int32)
                kwargs = {**kwargs, "cu_seq_lens_q": bounds, "cu_seq_lens_k": bounds}
        return attention(module, query, key, value, attention_mask, *args, **kwargs)

    attend.__wrapped__ = attention
    return attend


def _rows_follow_the_batch() -> None:
    """DeepSpeed's Ulysses attention checks every call against shapes fixed from the micro batch size;
    with variable lengths it updates their sequence dimension only. A packed micro batch is one
    flattened row, not micro_batch rows: the row count is taken from each call as well."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    if getattr(UlyssesSPAttentionHF.forward, "_rows_follow", False):
        return
    original = UlyssesSPAttentionHF.forward

    def forward(self, module, query, key, value, *args, **kwargs):
        rows = query.shape[0]
        if self.seq_length_is_variable and self.required_query_shape[1] != rows:
            self.batch_size = rows
            for name in ("required_query_shape", "required_key_value_shape", "required_context_shape"):
                shape = list(getattr(self, name))
                shape[1] = rows
                setattr(self, name, torch.Size(shape))
        return original(self, module, query, key, value, *args, **kwargs)

    forward._rows_follow = True
    UlyssesSPAttentionHF.forward = forward


def install_attention(attn_implementation: str) -> None:
    """Before the Trainer registers Ulysses on `attn_implementation`: its core function learns packed
    boundaries from the gathered position_ids, and its shape checks follow a packed batch's one row."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    _rows_follow_the_batch()

    current = ALL_ATTENTION_FUNCTIONS[attn_implementation]
    if not hasattr(current, "__wrapped__"):
        ALL_ATTENTION_FUNCTIONS[attn_implementation] = boundaries_from_positions(current)


# ---- tiled MLP -------------------------------------------------------------------------------------

def _mlps(model) -> list:
    """The decoder layers' dense MLP modules (gate/up/down or fc1/fc2 projections, no experts)."""
    found = []
    for module in model.modules():
        name = type(module).__name__
        if name.endswith("MLP") and not any(hasattr(module, a) for a in ("experts", "gate", "router")) \
                and any(isinstance(m, torch.nn.Linear) for m in module.children()):
            found.append(module)
        elif name.endswith("MLP") and hasattr(module, "gate_proj") and hasattr(module, "down_proj"):
            found.append(module)
    return found


def apply_tiled_mlp(model) -> int:
    """Make each dense MLP run in slices of the sequence (DeepSpeed's TiledMLP: the slice's intermediate
    activations only, recomputed in the backward). Returns how many MLPs were tiled."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    mlps = _mlps(model)
    for mlp in mlps:
        original = mlp.forward

        def tiled(x, _original=original, _mlp=mlp):
            if x.dim() < 2 or not torch.is_grad_enabled():
                return _original(x)
            hidden = x.shape[-1]
            shards = max(1, math.ceil(x.shape[-2] / hidden))
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                agreed = torch.tensor(shards, device=x.device)  # ZeRO-3 gathers weights: same count everywhere
                torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MAX)
                shards = int(agreed.item())
            params = [p for p in _mlp.parameters() if p.requires_grad]
            return TiledMLP.apply(lambda _self, piece: _original(piece), _mlp, x, shards, params)

        mlp.forward = tiled
    return len(mlps)


# ---- tiled logits and loss ---------------------------------------------------------------------------

SELF_CHECK_TOKENS = 64  # the first batch's leading positions on which the tiled loss is checked against the model's


def _causal_lm(model):
    """The transformers *ForCausalLM under a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _head_logits(base, hidden):
    """The lm_head's logits of `hidden` with the scalings the families apply after it, in fp32."""
    logits = base.get_output_embeddings()(hidden).float()
    config = base.config
    scale = getattr(base, "logit_scale", None)  # Cohere
    if isinstance(scale, (int, float)):
        logits = logits * scale
    divisor = getattr(config, "logits_scaling", None)  # Granite
    if isinstance(divisor, (int, float)) and divisor not in (0, 1):
        logits = logits / divisor
    cap = getattr(config, "final_logit_softcapping", None)  # Gemma 2 and 3
    if isinstance(cap, (int, float)) and cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def tiled_loss(base, hidden, targets, num_items_in_batch=None, slice_tokens: int | None = None):
    """Cross-entropy of `hidden` (trained positions, flat) against `targets` without the whole logits
    tensor: each slice's logits are made, summed into the loss and dropped, and made again in the
    backward (non-reentrant checkpoint). Reduced as transformers' causal LM loss: a sum over
    num_items_in_batch when given (gradient accumulation's token count), else the mean."""
    from torch.utils.checkpoint import checkpoint

    from tuiapp.core.plan.long_context import loss_slice_tokens

    vocab = getattr(base.config, "vocab_size", None) or 32000  # the weight's own shape is a shard under ZeRO-3
    slice_tokens = slice_tokens or loss_slice_tokens(vocab)

    def piece(h, y):
        return torch.nn.functional.cross_entropy(_head_logits(base, h), y, reduction="sum", ignore_index=-100)

    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden.shape[0], slice_tokens):
        total = total + checkpoint(piece, hidden[start:start + slice_tokens], targets[start:start + slice_tokens],
                                   use_reentrant=False)
    if num_items_in_batch is not None:
        return total / num_items_in_batch
    return total / max(1, int((targets != -100).sum()))


def _trained(labels, shift_labels, logits_to_keep):
    """(positions whose next token is trained, their targets): from a narrowed batch (trained_logits) or
    from the labels."""
    if torch.is_tensor(logits_to_keep) and logits_to_keep.dtype == torch.bool and shift_labels is not None \
            and shift_labels.dim() == 1:
        return logits_to_keep, shift_labels
    shifted = shift_labels if shift_labels is not None else \
        torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
    keep = shifted != -100
    return keep, shifted[keep]


class TiledLossMismatch(RuntimeError):
    """The model's forward does more than lm_head + cross-entropy: the tiled loss cannot stand in for it."""


def apply_tiled_loss(model) -> None:
    """Training forwards with labels return the tiled loss (no logits); evaluation and generation run the
    model's own forward. The first training batch checks the tiled loss against the model's own on its
    leading positions and raises TiledLossMismatch when a family computes its loss another way."""
    base = _causal_lm(model)
    if not type(base).__name__.endswith("ForCausalLM") or base.get_output_embeddings() is None:
        raise TiledLossMismatch(f"train.tiled_loss takes a causal LM with an lm_head; {type(base).__name__} is not one "
                                "(set train.tiled_loss = false)")
    original = base.forward
    checked = {"done": False}

    def forward(*args, labels=None, shift_labels=None, logits_to_keep=0, **kwargs):
        if not base.training or (labels is None and shift_labels is None) or not torch.is_grad_enabled() or args:
            return original(*args, labels=labels, shift_labels=shift_labels, logits_to_keep=logits_to_keep, **kwargs)
        from transformers.modeling_outputs import CausalLMOutputWithPast

        if not checked["done"]:
            checked["done"] = True
            _self_check(base, original, labels, shift_labels, logits_to_keep, kwargs)
        num_items = kwargs.pop("num_items_in_batch", None)
        outputs = base.get_decoder()(**kwargs)
        keep, targets = _trained(labels, shift_labels, logits_to_keep)
        loss = tiled_loss(base, outputs.last_hidden_state[keep], targets, num_items)
        return CausalLMOutputWithPast(loss=loss, logits=None, past_key_values=outputs.past_key_values)

    base.forward = forward


def _self_check(base, original, labels, shift_labels, logits_to_keep, kwargs) -> None:
    """The model's own loss and the tiled one on the first row's leading positions (a causal model's
    prefix does not see what follows): equal, or this family's forward does more than the tiled loss."""
    if shift_labels is not None or torch.is_tensor(logits_to_keep) or labels is None:
        return  # a narrowed or sharded batch: its own rows are checked on the next plain one
    n = min(SELF_CHECK_TOKENS, labels.shape[-1])
    row = {k: v[:1, :n] if torch.is_tensor(v) and v.dim() >= 2 and v.shape[-1] == labels.shape[-1] else v
           for k, v in kwargs.items() if k != "num_items_in_batch"}
    if any(torch.is_tensor(v) and v.dim() == 1 for v in row.values()):
        return  # packed boundaries (cu_seq_lens): nothing to slice them by
    small = labels[:1, :n].clone()
    small[:, -1] = -100  # the last kept position's target lies outside the slice
    with torch.no_grad():
        own = original(labels=small, **row).loss
        outputs = base.get_decoder()(**row)
        keep, targets = _trained(small, None, 0)
        tiled = tiled_loss(base, outputs.last_hidden_state[keep], targets)
    if own is None or not torch.isfinite(own) or not torch.isfinite(tiled):
        return
    if abs(float(own) - float(tiled)) > 1e-3 * max(1.0, abs(float(own))):
        raise TiledLossMismatch(f"train.tiled_loss: {type(base).__name__}'s own loss ({float(own):.5f}) and the tiled "
                                f"one ({float(tiled):.5f}) differ on the first batch: its forward adds to lm_head + "
                                "cross-entropy (a router's auxiliary loss, a scaling); set train.tiled_loss = false")


# ---- activation offload ------------------------------------------------------------------------------

def offload_activations(model) -> None:
    """The activations saved for backward go to pinned CPU memory during each forward of `model`."""
    from torch.autograd.graph import save_on_cpu

    contexts: list = []

    def enter(module, args, kwargs):
        if module.training and torch.is_grad_enabled():
            context = save_on_cpu(pin_memory=True)
            context.__enter__()
            contexts.append(context)

    def leave(module, args, kwargs, output):
        if contexts:
            contexts.pop().__exit__(None, None, None)

    model.register_forward_pre_hook(enter, with_kwargs=True)
    model.register_forward_hook(leave, with_kwargs=True, always_call=True)


# ---- RoPE scaling ----------------------------------------------------------------------------------------

def rope_overrides(recipe: Recipe, config) -> dict:
    """Config attributes for model.rope_scaling / model.max_position_embeddings (empty when unset)."""
    spec = recipe.model
    out: dict = {}
    original = getattr(config, "max_position_embeddings", None)
    if spec.rope_scaling is not None:
        current = dict(getattr(config, "rope_parameters", None) or {})
        theta = current.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        params = {**{k: v for k, v in current.items() if k in ("rope_theta", "partial_rotary_factor")},
                  "rope_type": spec.rope_scaling.type, "factor": float(spec.rope_scaling.factor),
                  "rope_theta": theta}
        if spec.rope_scaling.type == "yarn":
            params["original_max_position_embeddings"] = spec.rope_scaling.original_max_position_embeddings \
                or original
        out["rope_parameters"] = params
    if spec.max_position_embeddings:
        out["max_position_embeddings"] = spec.max_position_embeddings
    return out


def apply_rope(recipe: Recipe, config) -> dict:
    overrides = rope_overrides(recipe, config)
    for name, value in overrides.items():
        setattr(config, name, value)
    return overrides


# ---- the run's hooks (tuiapp.trainer.run) -----------------------------------------------------------------



def prepare(model, recipe: Recipe, collator, tokenizer):
    """The model and collator of a run with the long-context settings applied; the collator returned."""
    if recipe.train.tiled_mlp:
        apply_tiled_mlp(model)
    if recipe.train.tiled_loss:
        apply_tiled_loss(model)
    if recipe.train.activation_offload and torch.cuda.is_available():
        offload_activations(model)
    n = degree(recipe)
    if n <= 1:
        return collator
    install_attention(getattr(model.config, "_attn_implementation", None) or "sdpa")
    pad = getattr(tokenizer, "pad_token_id", None)
    return SequenceParallelCollator(collator, n, pad if pad is not None else getattr(tokenizer, "eos_token_id", 0),
                                    fixed_length=0 if torch.cuda.is_available() else padded_length(recipe))


def padded_length(recipe: Recipe) -> int:
    """The length every batch is padded to on CPU ranks (gloo's all_gather takes equal shapes only): a
    micro batch's flattened row when packed, else max_seq_len; rounded up to a multiple of the degree."""
    from tuiapp.core.plan.long_context import sp_padded_length

    return sp_padded_length(recipe)


def contiguous(inputs: dict) -> dict:
    """A shard's tensors as contiguous ones: the adapter slices (rows, sequence) columns out of each batch,
    which on CPU stay views, and the loss views shift_labels flat."""
    return {k: v.contiguous() if torch.is_tensor(v) else v for k, v in inputs.items()}


def group_loss(model, inputs: dict, return_outputs: bool = False):
    """The loss of one sequence-parallel shard as the token mean over the whole sequence (its group's
    shards), with the gradient of this shard's tokens only.

    transformers' own (deepspeed_sp_compute_loss) all-gathers the shard losses differentiably: every
    rank then back-propagates the whole group's loss, and DeepSpeed, which sums the gradients over the
    group, ends with N times the gradient (the same steps under Adam and clipping, an N times grad norm).
    Here the other shards' share is a constant: the value is the group's mean, the gradient this
    shard's part of it, and the group's sum the whole-sequence gradient."""
    from deepspeed.utils import groups

    inputs = contiguous(inputs)
    shift_labels = inputs["shift_labels"]
    if "labels" not in inputs:  # the adapter moved them to shift_labels; the model takes both
        inputs["labels"] = shift_labels
    outputs = model(**inputs)
    counted = (shift_labels != -100).sum()
    local = torch.where(counted > 0, outputs.loss * counted, torch.zeros_like(outputs.loss))
    totals = torch.stack([local.detach().float(), counted.float()])
    torch.distributed.all_reduce(totals, group=groups._get_sequence_parallel_group())
    share = local * groups._get_sequence_parallel_world_size() if zero_stage_of(model) in AVERAGING_STAGES else local
    loss = (share + (totals[0] - share.detach())) / totals[1].clamp(min=1)
    return (loss, outputs) if return_outputs else loss


# ZeRO stages whose gradient reduction averages over the sequence-parallel group on these ranks (the
# shard's gradient is then taken N times, so that the average is the whole sequence's): measured with
# tests/e2e/test_sequence_parallel.py against one rank (equal grad norms at ZeRO 0, 1, 2 and 3).
AVERAGING_STAGES = frozenset({3})


def zero_stage_of(engine) -> int:
    try:
        return int(engine.zero_optimization_stage())
    except AttributeError:
        return 0
