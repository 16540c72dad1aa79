"""[[dataset.sources]]: several datasets interleaved by weight into one training set.

Each source is tokenized through its own cache entry (data.cached_tokenized: one entry per source,
shared with any recipe that reads that source alone) and split by its own eval_split. The training
set is one epoch's draw over the sources' examples, as many as they hold together: each position
takes a source at random with the mixture's probabilities (seeded by train.seed, so the same recipe
draws the same mixture), and a source's examples are taken in a seeded random order, again from the
start when a heavily weighted source runs out (oversampled) while a lightly weighted one is only
partly used. The draw is an index array over the concatenated Arrow tables: no example is copied.
By tokens (dataset.mix_by = "tokens"), a source's probability is its weight divided by its mean
tokens per example, so its share of the tokens follows its weight.

The examples carry their source's index (`source`); SourceTokens, around the collator, turns it into
the batch's tokens per source (`source_tokens`), which the Trainer takes off the batch before the
model and the callbacks add up into the metrics' tokens/<label>.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow.compute as pc
import torch
from datasets import Dataset, concatenate_datasets

from tuiapp.trainer.dataset import sampling

SOURCE = "source"  # the column with each example's source index
SOURCE_TOKENS = "source_tokens"  # the batch's tokens per source


def tagged(dataset: Dataset, index: int) -> Dataset:
    """The dataset with a `source` column of `index` (an in-memory column beside its Arrow table)."""
    return dataset.add_column(SOURCE, np.full(len(dataset), index, dtype=np.int32))


def mixture_probabilities(weights: list[float], mean_tokens: list[float], mix_by: str) -> list[float]:
    """Each source's chance to give the next example: by examples its weight's share; by tokens its
    weight / its mean tokens per example, normalised (so expected tokens follow the weights)."""
    raw = [w / max(m, 1e-9) for w, m in zip(weights, mean_tokens, strict=True)] if mix_by == "tokens" else list(weights)
    total = sum(raw)
    return [r / total for r in raw]


def mean_tokens(dataset: Dataset) -> float:
    """Mean tokens per example (input_ids' length), computed in Arrow."""
    if len(dataset) == 0:
        return 0.0
    return float(pc.mean(sampling.length_array(dataset)).as_py())


def interleave(datasets: list[Dataset], probabilities: list[float], seed: int,
               size: int | None = None) -> Dataset:
    """`size` examples (default: all of the sources' together) drawn source by source with
    `probabilities`, each source's examples in a seeded random order (repeated when used up), as an
    index over the concatenated sources (tagged with their `source` column already)."""
    rng = np.random.default_rng(seed)
    lengths = [len(d) for d in datasets]
    size = sum(lengths) if size is None else size
    usable = [p if n else 0.0 for p, n in zip(probabilities, lengths, strict=True)]
    chosen = rng.choice(len(datasets), size=size, p=np.asarray(usable) / sum(usable))
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    indices = np.empty(size, dtype=np.int64)
    for k, n in enumerate(lengths):
        where = np.flatnonzero(chosen == k)
        if not len(where):
            continue
        order = np.concatenate([rng.permutation(n) for _ in range(math.ceil(len(where) / n))])[: len(where)]
        indices[where] = offsets[k] + order
    return concatenate_datasets(aligned(datasets)).select(indices)


def aligned(datasets: list[Dataset]) -> list[Dataset]:
    """The sources with the first one's column types (a list of int64 and one of int32 would not
    concatenate)."""
    first = datasets[0].features
    return [d if d.features == first else d.cast(first) for d in datasets]


class SourceTokens:
    """Around a collator: each example's `source` is taken off, and the batch gets `source_tokens`,
    its tokens (input_ids) per source, for the metrics; batches without sources pass through."""

    def __init__(self, collator, sources: int):
        self.collator, self.sources = collator, sources

    def __call__(self, features: list[dict]):
        if not features or SOURCE not in features[0]:
            return self.collator(features)
        counts = [0] * self.sources
        stripped = []
        for feature in features:
            feature = dict(feature)
            counts[int(feature.pop(SOURCE))] += len(feature["input_ids"])
            stripped.append(feature)
        batch = self.collator(stripped)
        batch[SOURCE_TOKENS] = torch.tensor(counts, dtype=torch.int64)
        return batch
