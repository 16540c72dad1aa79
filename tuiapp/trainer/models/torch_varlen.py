"""Packed attention on CUDA with torch's own FlashAttention varlen kernels (no flash-attn wheel).

torch 2.13 ships FlashAttention's variable-length kernels as `torch.nn.attention.varlen.varlen_attn`:
a flattened row of packed examples (`DataCollatorWithFlattening`, its `cu_seq_lens_q`) runs in one
call, causal inside each example, with grouped-query attention, and costs Σ lengths²/2 as
flash-attention's varlen path does. `install()` registers it with transformers as the attention
implementation `torch_varlen` (core.plan.model_profile.TORCH_VARLEN; `model.attn_implementation =
"auto"` picks it on CUDA for packed batches when flash-attn is absent).

Where the kernel cannot run (CPU tensors, fp32, a head dim it lacks, a softcap, a sliding window
shorter than the row's longest example, attention dropout) the call runs sdpa once per example,
causal (the reference the CPU tests hold it to). Calls without boundaries (generation, unpacked or
padded batches) run transformers' sdpa with its mask. A forward that carries boundaries runs under
a second name, PACKED, that has no mask function (mark_packed_rows switches the decoder's config to it
for that forward): transformers then builds no mask and does not look for packed rows in the
position ids, which reads a value on the host (a device sync) every forward.
"""

from __future__ import annotations

import functools
import itertools

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from tuiapp.core.plan.model_profile import TORCH_VARLEN

PACKED = f"{TORCH_VARLEN}_packed"  # the same function, while a forward carries boundaries: no mask made
MAX_HEAD_DIM = 256  # FlashAttention's kernels: head dims up to 256, multiples of 8
_row: dict = {"tokens": None}  # the flattened packed row the running forward carries (its length)


@functools.lru_cache(maxsize=8)
def available(device: torch.device | None = None) -> bool:
    """torch's varlen kernels can run here: the module exists, a CUDA GPU of compute capability ≥ 8.0."""
    try:
        from torch.nn.attention import varlen  # noqa: F401
    except ImportError:
        return False
    if not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device)[0] >= 8


def kernel_fits(head_dim: int, dtype: torch.dtype, *, softcap: float | None = None, window: int | None = None,
                longest: int | None = None, dropout: float = 0.0) -> bool:
    """The settings of one attention call the varlen kernel runs as the model means them."""
    if dtype not in (torch.float16, torch.bfloat16) or head_dim > MAX_HEAD_DIM or head_dim % 8:
        return False
    if softcap or dropout:
        return False
    return not (window and (longest is None or longest > window))


def _windows(module, kwargs) -> int | None:
    window = getattr(module, "sliding_window", None) or kwargs.get("sliding_window")
    return window if isinstance(window, int) and window > 0 else None


def _per_example(query, key, value, bounds: list[int], scaling) -> torch.Tensor:
    """sdpa once per example, causal; (heads, tokens, dim) in, (tokens, heads, dim) out."""
    sizes = [end - start for start, end in itertools.pairwise(bounds)]
    gqa = query.shape[0] != key.shape[0]
    pieces = [torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=gqa)
              for q, k, v in zip(query.split(sizes, dim=1), key.split(sizes, dim=1), value.split(sizes, dim=1),
                                 strict=True) if q.shape[1]]
    return torch.cat(pieces, dim=1).transpose(0, 1)


def packed_attention(query, key, value, cu_seq_lens: torch.Tensor, max_length: int | None, *, scaling=None,
                     softcap: float | None = None, window: int | None = None, dropout: float = 0.0) -> torch.Tensor:
    """Causal attention over a flattened row of packed examples.

    query (heads_q, tokens, dim), key/value (heads_kv, tokens, dim); returns (tokens, heads_q, dim).
    The varlen kernel where it fits, else sdpa per example."""
    if max_length is None:
        max_length = int((cu_seq_lens[1:] - cu_seq_lens[:-1]).max())
    if query.is_cuda and available(query.device) and kernel_fits(query.shape[-1], query.dtype, softcap=softcap,
                                                                 window=window, longest=max_length, dropout=dropout):
        cu = cu_seq_lens.to(device=query.device, dtype=torch.int32)
        return _varlen_call(query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1), cu, max_length,
                            scaling)
    return _per_example(query, key, value, cu_seq_lens.tolist(), scaling)


@functools.lru_cache(maxsize=1)
def _varlen_params() -> frozenset[str]:
    """The keywords this torch's varlen_attn takes: 2.13 has scale, window_size and enable_gqa; earlier
    releases (2.10-2.11) have is_causal and, in some, scale, and no grouped-query attention."""
    import inspect

    from torch.nn.attention.varlen import varlen_attn

    return frozenset(inspect.signature(varlen_attn).parameters)


def _varlen_call(query, key, value, cu: torch.Tensor, max_length: int, scaling) -> torch.Tensor:
    """varlen_attn, causal, on (tokens, heads, dim) tensors, on whichever signature this torch has."""
    from torch.nn.attention.varlen import varlen_attn

    params = _varlen_params()
    kwargs: dict = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    if "scale" in params:
        kwargs["scale"] = scaling
    elif scaling is not None:  # the default scale is 1/sqrt(dim): fold the model's own into the query
        query = query * (scaling * query.shape[-1] ** 0.5)
    if query.shape[1] != key.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:  # grouped-query attention as full heads
            groups = query.shape[1] // key.shape[1]
            key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return varlen_attn(query, key, value, cu, cu, max_length, max_length, **kwargs)


def torch_varlen_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The transformers attention function `torch_varlen`: query/key/value (batch, heads, seq, dim);
    returns ((batch, seq, heads, dim), None) as transformers' own functions do."""
    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    packed = (cu_seq_lens is not None and query.shape[0] == 1 and query.shape[2] == key.shape[2]
              and kwargs.get("position_bias") is None)
    if not packed:
        if attention_mask is None and _row["tokens"] == query.shape[2]:
            raise RuntimeError("a packed row reached torch_varlen attention without its boundaries")
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **{k: v for k, v in kwargs.items() if k not in ("cu_seq_lens_q", "cu_seq_lens_k",
                                                                                  "max_length_q", "max_length_k")})
    softcap = kwargs.get("softcap") or getattr(module, "attn_logit_softcapping", None)
    out = packed_attention(query[0], key[0], value[0], cu_seq_lens, kwargs.get("max_length_q"), scaling=scaling,
                           softcap=softcap, window=_windows(module, kwargs),
                           dropout=dropout if module.training else 0.0)
    return out.unsqueeze(0), None


def mask_unless_packed(*args, **kwargs):
    """transformers' sdpa mask, or none for the flattened packed row of the running forward."""
    if (not args and _row["tokens"] is not None and kwargs.get("attention_mask") is None
            and kwargs.get("batch_size") == 1 and kwargs.get("q_length") == kwargs.get("kv_length") == _row["tokens"]
            and not kwargs.get("q_offset") and not kwargs.get("kv_offset")):
        return None
    return sdpa_mask(*args, **kwargs)


def install() -> None:
    AttentionInterface.register(TORCH_VARLEN, torch_varlen_attention)
    AttentionMaskInterface.register(TORCH_VARLEN, mask_unless_packed)
    AttentionInterface.register(PACKED, torch_varlen_attention)  # no mask function: transformers makes none


def mark_packed_rows(model) -> None:
    """For each forward of `model`'s decoder that carries packed boundaries: note its row's length
    (no host read) and run it under PACKED, back to TORCH_VARLEN after it."""
    decoder = model.base_model

    def note_row(module, args, kwargs):
        ids = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs.get("inputs_embeds")
        if ids is None and args:
            ids = args[0]
        _row["tokens"] = ids.shape[1] if kwargs.get("cu_seq_lens_q") is not None and ids is not None else None
        config = getattr(module, "config", None)
        if _row["tokens"] is not None and getattr(config, "_attn_implementation", None) == TORCH_VARLEN:
            config._attn_implementation = PACKED

    def forget_row(module, args, kwargs, output):
        _row["tokens"] = None
        config = getattr(module, "config", None)
        if getattr(config, "_attn_implementation", None) == PACKED:
            config._attn_implementation = TORCH_VARLEN

    decoder.register_forward_pre_hook(note_row, with_kwargs=True)
    decoder.register_forward_hook(forget_row, with_kwargs=True, always_call=True)
