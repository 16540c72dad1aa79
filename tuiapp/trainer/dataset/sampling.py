"""The training order in bounded memory, whatever the number of examples.

torch's RandomSampler turns the epoch's whole permutation into a Python list (about 36 bytes an
example: 160 MB for the 4.4M blocks of a 4 GB corpus), so a rank's memory grew with the corpus.
LeanRandomSampler hands out the same permutation, from the same generator, a chunk at a time, and
make_lean puts it under the sampler accelerate prepares for the Trainer.
Lengths for token-budget batches are read from the Arrow column, not from a Python list of every
example's ids.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow.compute as pc
import torch
from accelerate.data_loader import SeedableRandomSampler
from torch.utils.data import RandomSampler

CHUNK = 1 << 16  # examples turned into Python ints at a time


class LeanRandomSampler(RandomSampler):
    """RandomSampler's order, example for example (the same calls on the same generator)."""

    def __iter__(self) -> Iterator[int]:
        if self.replacement:
            yield from super().__iter__()
            return
        n = len(self.data_source)
        generator = self.generator
        if generator is None:  # as torch does: a seed drawn from the global generator
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
            generator = torch.Generator()
            generator.manual_seed(seed)
        for _ in range(self.num_samples // n):
            yield from _chunked(torch.randperm(n, generator=generator))
        yield from _chunked(torch.randperm(n, generator=generator)[: self.num_samples % n])


def _chunked(order: torch.Tensor) -> Iterator[int]:
    for chunk in order.split(CHUNK):
        yield from chunk.tolist()


class LeanSeedableRandomSampler(SeedableRandomSampler, LeanRandomSampler):
    """accelerate's sampler (the order seeded by data seed + epoch, so a resume sees the same order),
    whose `super().__iter__()` is LeanRandomSampler's."""


LEAN = {RandomSampler: LeanRandomSampler, SeedableRandomSampler: LeanSeedableRandomSampler}


def make_lean(loader) -> None:
    """The prepared training loader's random sampler made its lean twin, in place: accelerate replaces
    any RandomSampler the Trainer gives it with its own SeedableRandomSampler, so the sampler is
    swapped where it ends up (its state — seed, epoch, generator — is kept)."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    inner = getattr(batch_sampler, "batch_sampler", batch_sampler)  # several ranks: a shard of a BatchSampler
    sampler = getattr(inner, "sampler", None)
    if type(sampler) in LEAN:
        sampler.__class__ = LEAN[type(sampler)]


def length_array(dataset, column: str = "input_ids"):
    """Each example's length in tokens as an Arrow array, in the dataset's order (a split's or a
    selection's rows through its indices)."""
    lengths = pc.list_value_length(dataset.data.column(column))
    indices = getattr(dataset, "_indices", None)
    if indices is not None:
        lengths = pc.take(lengths, indices.column(0))
    return lengths


def example_lengths(dataset, column: str = "input_ids") -> list[int]:
    return np.asarray(length_array(dataset, column), dtype=np.int64).tolist() if len(dataset) else []
