"""Batch shapes bucketed for the CUDA caching allocator.

A packed micro batch's length changes every step (Σ of its examples' lengths), and the allocator
keeps a block per shape it saw: the first GPU run measured reserved memory at 2.3x the allocated
peak. Here a batch's length is padded up to a multiple of BUCKET tokens, so a run sees a few dozen
shapes at most. The padding is a segment of its own (labels -100, positions from 0): a flattened row
gets it as one more sequence in `cu_seq_lens`, so no real token attends to it and the loss, the
token counts (padding is the pad token) and the gradients are those of the batch without it.
"""

from __future__ import annotations

import torch

from tuiapp.trainer.dataset.packing import IGNORE

BUCKET = 64  # tokens


def bucket_multiple(cuda: bool) -> int:
    """The multiple batch lengths are padded to: BUCKET on a GPU, none on the CPU (no caching allocator)."""
    return BUCKET if cuda else 0


class BucketedLengths:
    """Wraps a collator: its batch's sequence length padded up to a multiple of `multiple`."""

    def __init__(self, collator, multiple: int, pad_token_id: int):
        self.collator, self.multiple, self.pad_token_id = collator, multiple, pad_token_id

    def __getattr__(self, name):  # the wrapped collator's own attributes (the Trainer reads a few)
        return getattr(self.collator, name)

    def __call__(self, features):
        batch = self.collator(features)
        ids = batch.get("input_ids")
        if not self.multiple or not isinstance(ids, torch.Tensor) or ids.ndim != 2:
            return batch
        width = ids.shape[1]
        pad = -width % self.multiple
        if not pad:
            return batch
        rows = ids.shape[0]
        fills = {"input_ids": self.pad_token_id, "labels": IGNORE, "attention_mask": 0}
        for key, fill in fills.items():
            if isinstance(batch.get(key), torch.Tensor):
                batch[key] = torch.cat([batch[key], batch[key].new_full((rows, pad), fill)], dim=1)
        if isinstance(batch.get("position_ids"), torch.Tensor):
            positions = batch["position_ids"]
            batch["position_ids"] = torch.cat([positions, torch.arange(pad, dtype=positions.dtype).expand(rows, pad)],
                                              dim=1)
        for key in ("cu_seq_lens_q", "cu_seq_lens_k"):
            if isinstance(batch.get(key), torch.Tensor):
                cu = batch[key]
                batch[key] = torch.cat([cu, cu.new_tensor([width + pad])])
        for key in ("max_length_q", "max_length_k"):
            if isinstance(batch.get(key), int):
                batch[key] = max(batch[key], pad)
        if isinstance(batch.get("seq_idx"), torch.Tensor):
            seq = batch["seq_idx"]
            batch["seq_idx"] = torch.cat([seq, seq.new_full((rows, pad), int(seq.max()) + 1)], dim=1)
        return batch
