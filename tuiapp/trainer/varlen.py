"""Variable-length attention on sdpa: packed examples without a (Σ lengths)² mask.

A packed micro batch is one flattened row (`DataCollatorWithFlattening` with its sequence
boundaries, `cu_seq_lens_q`). flash-attention runs such a row with its varlen kernels. sdpa has no
varlen entry point, so transformers gives it a block-diagonal mask over the whole row, and the
kernel computes every block of it. Here sdpa runs once per example instead, causal, without a
mask: attention then costs Σ lengths²/2, the work flash-attention's varlen path does. That pays on
the CPU; on a GPU the per-example calls cost more than they save (runs_varlen).

`install()` wraps transformers' "sdpa" attention function in this process (the trainer's ranks).
Calls without sequence boundaries (generation, unpacked batches, pretrain blocks) and layers with a
sliding window or a position bias go to the original function unchanged.
"""

from __future__ import annotations

import itertools

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

_bounds_of: dict = {"tensor": None, "list": None}  # one host read of the boundaries per forward


def _boundaries(cu_seq_lens: torch.Tensor) -> list[int]:
    if _bounds_of["tensor"] is not cu_seq_lens:
        _bounds_of["tensor"], _bounds_of["list"] = cu_seq_lens, cu_seq_lens.tolist()
    return _bounds_of["list"]


def _example_bounds(module, query, key, kwargs) -> list[int] | None:
    """The packed examples' boundaries in this row, or None where sdpa should run as it is."""
    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    if (cu_seq_lens is None or query.shape[0] != 1 or getattr(module, "sliding_window", None)
            or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None):
        return None
    bounds = _boundaries(cu_seq_lens)
    return bounds if bounds[-1] == query.shape[2] == key.shape[2] else None  # not: virtual tokens, a prefix cache


def sdpa_per_example(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' sdpa attention, run per packed example when the batch carries boundaries."""
    bounds = _example_bounds(module, query, key, kwargs)
    if bounds is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    kwargs = {k: v for k, v in kwargs.items() if k not in ("cu_seq_lens_q", "cu_seq_lens_k", "is_causal")}
    pieces = [
        sdpa_attention_forward(module, query[:, :, start:end], key[:, :, start:end], value[:, :, start:end], None,
                               dropout=dropout, scaling=scaling, is_causal=True, **kwargs)[0]
        for start, end in itertools.pairwise(bounds) if end > start
    ]
    return torch.cat(pieces, dim=1), None  # (batch, seq, heads, dim), as sdpa_attention_forward returns


def install() -> None:
    AttentionInterface.register("sdpa", sdpa_per_example)


def runs_varlen(attn_implementation: str | None, cuda: bool) -> bool:
    """Attention that takes a flattened row of packed examples without a mask over the row.

    sdpa per example only on the CPU: on an H200 (bench/GPU_RESULTS.md, attention stage) it ran a
    0.5 B model's packed steps 3-4x slower than eager on rows of max_seq_len (packing.py), so on a GPU
    sdpa gets those rows too, with their block-diagonal mask."""
    name = str(attn_implementation or "")
    return "flash_attention" in name or (name == "sdpa" and not cuda)
