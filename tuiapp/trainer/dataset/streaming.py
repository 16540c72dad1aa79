"""`dataset.streaming = true`: records read from the data files and tokenized as training asks for them.

Nothing is tokenized ahead (no cache entry): the first step comes in seconds whatever the corpus size,
and memory holds one batch of documents. The examples are the ones the cached path builds, in file
order: pretraining cuts its blocks from DOCS_PER_BLOCK_BATCH documents at a time, as the cache does;
SFT tokenizes each record. Every rank reads the stream and keeps its share of each step's batches
(accelerate's IterableDatasetShard: `dispatch_batches` off), so ranks need no shared reader.

Resume is exact: the stream has no shuffle, and the Trainer skips the batches the checkpoint's steps
used before it trains again (re-reading them costs time, not memory). Preflight keeps streaming to
what it can do: max_steps set, no held-out fraction (an eval file is fine), no token-budget batches.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import torch
from datasets import Dataset

from tuiapp.core.common.errors import DatasetError
from tuiapp.core.config.recipe import Recipe
from tuiapp.core.data.datasets import eval_file_spec, iter_records
from tuiapp.trainer.dataset import data


def build_datasets(recipe: Recipe, tokenizer, cache_dir, base_dir=None) -> tuple["TokenizedStream", Dataset | None]:
    """(the training stream, the eval file's examples or None): data.build_datasets for a stream."""
    if recipe.dataset.sources:  # preflight refuses it (preflight.mixture_rules)
        raise DatasetError(message="a mixture ([[dataset.sources]]) is not streamed", key="dataset.streaming",
                           fix="set dataset.streaming = false, or use one dataset")
    eval_spec = eval_file_spec(recipe.dataset)
    held_out = data.cached_tokenized(eval_spec, recipe, tokenizer, Path(cache_dir), base_dir) if eval_spec else None
    bounded = data.bounded_eval(held_out, recipe, shuffle=True) if held_out is not None else None
    return TokenizedStream(recipe, tokenizer, base_dir), bounded


class TokenizedStream(torch.utils.data.IterableDataset):
    """The training examples of a recipe's data files, tokenized batch by batch while iterated."""

    def __init__(self, recipe: Recipe, tokenizer, base_dir=None):
        self.recipe, self.tokenizer, self.base_dir = recipe, tokenizer, base_dir

    def __iter__(self) -> Iterator[dict]:
        records = iter_records(self.recipe.dataset, self.base_dir)
        while batch := list(itertools.islice(records, data.DOCS_PER_BLOCK_BATCH)):
            columns = data.tokenized_batch(batch, self.recipe, self.tokenizer)
            keys = list(columns)
            for values in zip(*(columns[k] for k in keys), strict=True):
                yield dict(zip(keys, values, strict=True))


def accelerator_config() -> dict:
    """Each rank iterates the stream and keeps its share (rank 0 does not read and send every batch)."""
    return {"dispatch_batches": False, "split_batches": False}
