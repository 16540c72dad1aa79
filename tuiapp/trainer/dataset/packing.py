"""Packed SFT batches for eager attention, which has no variable-length path, and for sdpa on a GPU.

`DataCollatorWithFlattening` puts a whole micro batch in one row; flash-attention's varlen kernels
and sdpa run once per example (varlen.py) take it as it is. eager would give that row a
block-diagonal mask, and attention would cost (Σ lengths)². Here the micro batch's examples
are packed first-fit-decreasing into rows of at most max_seq_len tokens: position_ids restart at
each example (transformers keeps packed examples apart from them), the first label of each
example is -100 as with the flattening collator, and rows end with a padding segment.

Token-budget batches (train.batching = "tokens"): TokenBudgetBatches groups the shuffled examples
into micro batches of at most a token budget each; the collators above pack each one.
"""

from __future__ import annotations

import random

import torch

IGNORE = -100  # the label of a position no loss is taken at (transformers' ignore_index)


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


def budget_batches(lengths: list[int], budget: int, seed: int) -> list[list[int]]:
    """Example indices in shuffled order, cut into batches whose lengths sum to at most `budget`
    (an example longer than the budget gets a batch of its own)."""
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    batches: list[list[int]] = []
    current: list[int] = []
    used = 0
    for index in order:
        if current and used + lengths[index] > budget:
            batches.append(current)
            current, used = [], 0
        current.append(index)
        used += lengths[index]
    if current:
        batches.append(current)
    return batches


class TokenBudgetBatches(torch.utils.data.Sampler):
    """A rank's micro batches of at most `budget` tokens. Every rank cuts the same batches from the
    same shuffle (seed + epoch, no communication) and takes every world-th one; the last few
    batches that would leave ranks uneven are dropped (fewer than `world` per epoch)."""

    def __init__(self, lengths: list[int], budget: int, seed: int, rank: int = 0, world: int = 1):
        self.lengths, self.budget, self.seed = list(lengths), budget, seed
        self.rank, self.world = rank, max(1, world)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _mine(self) -> list[list[int]]:
        batches = budget_batches(self.lengths, self.budget, self.seed + self.epoch)
        usable = len(batches) - len(batches) % self.world
        return batches[self.rank:usable:self.world]

    def __iter__(self):
        return iter(self._mine())

    def __len__(self) -> int:
        return len(self._mine())
