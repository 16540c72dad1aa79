"""Variable-length attention on sdpa: packed examples without a (Σ lengths)² mask.

A packed micro batch is one flattened row (`DataCollatorWithFlattening` with its sequence
boundaries, `cu_seq_lens_q`). flash-attention runs such a row with its varlen kernels. sdpa has no
varlen entry point, so transformers gives it a block-diagonal mask over the whole row, and the
kernel computes every block of it. Here sdpa runs once per example instead, causal, without a
mask: attention then costs Σ lengths²/2, the work flash-attention's varlen path does. That pays on
the CPU; on a GPU the per-example calls cost more than they save (runs_varlen).

`install()` wraps transformers' "sdpa" attention function in this process (the trainer's ranks).
Calls without sequence boundaries (generation, unpacked batches, pretrain blocks) and layers with a
position bias, or a sliding window shorter than the row's longest example, go to the original
function unchanged.

`skip_packed_mask(model)` spares the forward the mask itself: transformers still builds the
tokens × tokens mask of a flattened row (from its position ids) before the layers run, though no
layer reads it. While a forward carries boundaries and every layer runs per example, the "sdpa"
mask function returns no mask.
"""

from __future__ import annotations

import itertools

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

_bounds_of: dict = {"tensor": None, "list": None}  # one host read of the boundaries per forward
# the flattened row the forward now runs without a mask: its length and its examples' boundaries
_maskless_row: dict = {"tokens": None, "bounds": None}


def _boundaries(cu_seq_lens: torch.Tensor) -> list[int]:
    if _bounds_of["tensor"] is not cu_seq_lens:
        _bounds_of["tensor"], _bounds_of["list"] = cu_seq_lens, cu_seq_lens.tolist()
    return _bounds_of["list"]


def _longest(bounds: list[int]) -> int:
    return max((end - start for start, end in itertools.pairwise(bounds)), default=0)


def _example_bounds(module, query, key, kwargs) -> list[int] | None:
    """The packed examples' boundaries in this row, or None where sdpa should run as it is. A layer
    whose attention is not handed the boundaries (StableLM's decoder layer passes no extra keywords)
    gets those of the maskless row its forward runs: that row has no mask to fall back to."""
    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    if query.shape[0] != 1 or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None:
        return None
    if cu_seq_lens is not None:
        bounds = _boundaries(cu_seq_lens)
    elif _maskless_row["tokens"] == query.shape[2] and _maskless_row["bounds"] is not None:
        bounds = _maskless_row["bounds"]
    else:
        return None
    window = getattr(module, "sliding_window", None) or kwargs.get("sliding_window")
    if window and _longest(bounds) > window:  # within the window a sliding layer is plain causal
        return None
    return bounds if bounds[-1] == query.shape[2] == key.shape[2] else None  # not: virtual tokens, a prefix cache


def sdpa_per_example(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' sdpa attention, run per packed example when the batch carries boundaries."""
    bounds = _example_bounds(module, query, key, kwargs)
    if bounds is None:
        if attention_mask is None and _maskless_row["tokens"] == query.shape[2]:
            raise RuntimeError("a packed row reached sdpa without its mask and cannot run per example")
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    kwargs = {k: v for k, v in kwargs.items() if k not in ("cu_seq_lens_q", "cu_seq_lens_k", "is_causal")}
    # split, not slices: the backward of a split is one cat of the pieces' gradients, where each
    # slice's would be a zero-filled tensor of the whole row, summed (rows of many examples paid that)
    sizes = [end - start for start, end in itertools.pairwise(bounds)]
    pieces = [
        sdpa_attention_forward(module, q, k, v, None, dropout=dropout, scaling=scaling, is_causal=True, **kwargs)[0]
        for q, k, v in zip(query.split(sizes, dim=2), key.split(sizes, dim=2), value.split(sizes, dim=2), strict=True)
        if q.shape[2]
    ]
    return torch.cat(pieces, dim=1), None  # (batch, seq, heads, dim), as sdpa_attention_forward returns


def sdpa_mask_unless_per_example(*args, **kwargs):
    """transformers' sdpa mask, or none for the flattened row of a forward whose layers all run per
    example (a causal or sliding-window mask over the row; not a bidirectional one, an overlay, a
    padding mask, a KV cache or virtual tokens)."""
    if (not args and _maskless_row["tokens"] is not None and kwargs.get("attention_mask") is None
            and kwargs.get("batch_size") == 1 and kwargs.get("q_length") == kwargs.get("kv_length")
            == _maskless_row["tokens"] and not kwargs.get("q_offset") and not kwargs.get("kv_offset")
            and not kwargs.get("use_vmap") and "allow_is_bidirectional_skip" not in kwargs):
        return None
    return sdpa_mask(*args, **kwargs)


def install() -> None:
    AttentionInterface.register("sdpa", sdpa_per_example)
    AttentionMaskInterface.register("sdpa", sdpa_mask_unless_per_example)


def _smallest_window(model) -> int | None:
    windows = [getattr(module, "sliding_window", None) for module in model.modules()]
    windows.append(getattr(model.config, "sliding_window", None))  # some families pass it per call
    return min((w for w in windows if isinstance(w, int) and w > 0), default=None)


def skip_packed_mask(model) -> None:
    """Mark the forwards of `model`'s decoder that carry a flattened row every layer runs per
    example (sdpa_mask_unless_per_example then makes no mask for them)."""
    decoder = model.base_model
    window = _smallest_window(model)

    def note_row(module, args, kwargs):
        cu_seq_lens = kwargs.get("cu_seq_lens_q")
        _maskless_row["tokens"] = _maskless_row["bounds"] = None
        if cu_seq_lens is not None and getattr(module.config, "_attn_implementation", None) == "sdpa":
            bounds = _boundaries(cu_seq_lens)
            if not window or _longest(bounds) <= window:
                _maskless_row["tokens"], _maskless_row["bounds"] = bounds[-1], bounds

    def forget_row(module, args, kwargs, output):
        _maskless_row["tokens"] = _maskless_row["bounds"] = None

    decoder.register_forward_pre_hook(note_row, with_kwargs=True)
    decoder.register_forward_hook(forget_row, with_kwargs=True, always_call=True)


def runs_varlen(attn_implementation: str | None, cuda: bool) -> bool:
    """Attention that takes a flattened row of packed examples without a mask over the row.

    sdpa per example only on the CPU: on an H200 (bench/GPU_RESULTS.md, attention stage) it ran a
    0.5 B model's packed steps 3-4x slower than eager on rows of max_seq_len (packing.py), so on a GPU
    sdpa gets those rows too, with their block-diagonal mask. torch_varlen (torch_varlen.py) takes the
    flattened row with its boundaries, flex_attention with a document mask from its position ids."""
    name = str(attn_implementation or "")
    return ("flash_attention" in name or name in ("torch_varlen", "flex_attention")
            or (name == "sdpa" and not cuda))
