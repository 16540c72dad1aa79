"""Packed SFT batches for attention without variable-length kernels.

`DataCollatorWithFlattening` puts a whole micro batch in one row. With flash-attention's varlen
kernels that is ideal; with sdpa/eager the row gets a block-diagonal mask, and attention costs
(Σ lengths)² — more than the padding it saves (bench/RESULTS.md). Here the micro batch's examples
are packed first-fit-decreasing into rows of at most max_seq_len tokens: position_ids restart at
each example (transformers keeps packed examples apart from them), the first label of each
example is -100 as with the flattening collator, and rows end with a padding segment.
"""

from __future__ import annotations

import torch

IGNORE = -100


def pack_rows(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices of examples grouped into rows, first-fit decreasing by length."""
    rows: list[list[int]] = []
    used: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for row, total in enumerate(used):
            if total + lengths[index] <= capacity:
                rows[row].append(index)
                used[row] += lengths[index]
                break
        else:
            rows.append([index])
            used.append(lengths[index])
    return rows


class PackedRowsCollator:
    def __init__(self, max_seq_len: int, pad_token_id: int):
        self.max_seq_len = max_seq_len
        self.pad_token_id = pad_token_id

    def __call__(self, features: list[dict]) -> dict:
        lengths = [len(f["input_ids"]) for f in features]
        rows = pack_rows(lengths, max(self.max_seq_len, max(lengths)))
        width = max(sum(lengths[i] for i in row) for row in rows)
        ids, labels, positions = [], [], []
        for row in rows:
            row_ids, row_labels, row_positions = [], [], []
            for index in row:
                feature = features[index]
                row_ids += list(feature["input_ids"])
                row_labels += [IGNORE] + list(feature["labels"][1:])
                row_positions += list(range(lengths[index]))
            pad = width - len(row_ids)
            ids.append(row_ids + [self.pad_token_id] * pad)
            labels.append(row_labels + [IGNORE] * pad)
            positions.append(row_positions + list(range(pad)))
        return {
            "input_ids": torch.tensor(ids),
            "labels": torch.tensor(labels),
            "position_ids": torch.tensor(positions),
        }
