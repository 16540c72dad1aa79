"""Mixtures ([[dataset.sources]]): one cache entry per source, a reproducible draw that follows the
weights (by examples or by tokens), held-out examples per source, tokens per source in each batch."""

from __future__ import annotations

import numpy as np
import pytest
from datasets import Dataset
from transformers import AutoTokenizer

from tuiapp.core.config.recipe import Recipe
from tuiapp.trainer.dataset import data, mixture
from tuiapp.trainer.dataset.data import build_datasets, make_collator


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def mix(*sources, seed=7, mix_by="examples", **train) -> Recipe:
    return Recipe.model_validate({
        "method": {"kind": "sft"}, "dataset": {"sources": list(sources), "mix_by": mix_by},
        "train": {"max_seq_len": 256, "packing": False, "seed": seed, **train}})


def shares(values, n: int) -> list[float]:
    counts = np.bincount(np.asarray(values), minlength=n)
    return list(counts / counts.sum())


def test_sources_interleave_reproducibly_by_weight(tokenizer, tmp_path):
    recipe = mix({"name": "demo:facts", "weight": 3}, {"name": "demo:chat", "weight": 1})
    train, eval_set = build_datasets(recipe, tokenizer, tmp_path)
    assert eval_set is None
    assert len(train) == 1440 + 800  # one epoch: as many examples as the sources hold together
    facts, chat = shares(train[mixture.SOURCE], 2)
    assert facts == pytest.approx(0.75, abs=0.03) and chat == pytest.approx(0.25, abs=0.03)
    again, _ = build_datasets(recipe, tokenizer, tmp_path)
    assert again[mixture.SOURCE] == train[mixture.SOURCE] and again["input_ids"] == train["input_ids"]
    other, _ = build_datasets(mix(*[s.model_dump() for s in recipe.dataset.sources], seed=8), tokenizer, tmp_path)
    assert other[mixture.SOURCE] != train[mixture.SOURCE]
    # one cache entry per source, the one a recipe reading that source alone uses
    entries = sorted(p.name for p in (tmp_path / "data").iterdir() if not p.name.startswith("."))
    spec = recipe.dataset.source_specs()[0]
    assert len(entries) == 2 and data.cache_key(spec, recipe, tokenizer) in entries
    alone = Recipe.model_validate({"method": {"kind": "sft"}, "dataset": {"name": "demo:facts"},
                                   "train": {"max_seq_len": 256, "packing": False}})
    assert data.cache_key(alone.dataset, alone, tokenizer) in entries


def test_a_mixture_by_tokens_shares_the_tokens_by_weight(tokenizer, tmp_path):
    sources = ({"name": "demo:facts", "weight": 1}, {"name": "demo:chat", "weight": 1})
    lengths = {}
    for mix_by in ("examples", "tokens"):
        train, _ = build_datasets(mix(*sources, mix_by=mix_by), tokenizer, tmp_path)
        tokens = np.zeros(2)
        for source, ids in zip(train[mixture.SOURCE], train["input_ids"], strict=True):
            tokens[source] += len(ids)
        lengths[mix_by] = tokens / tokens.sum()
    assert abs(lengths["examples"][0] - 0.5) > 0.1  # chats are longer than facts: examples do not share tokens
    assert lengths["tokens"][0] == pytest.approx(0.5, abs=0.05)


def test_each_source_holds_its_own_share_out(tokenizer, tmp_path):
    recipe = mix({"name": "demo:facts", "eval_split": 0.1}, {"name": "demo:chat", "eval_split": 0.05},
                 eval_max_samples=0)
    train, eval_set = build_datasets(recipe, tokenizer, tmp_path)
    assert len(eval_set) == 144 + 40 and mixture.SOURCE not in eval_set.column_names
    assert len(train) == 1440 - 144 + 800 - 40
    held = {tuple(ids) for ids in eval_set["input_ids"]}
    assert not held & {tuple(ids) for ids in train["input_ids"]}  # no held-out example trains
    capped = mix({"name": "demo:facts", "eval_split": 0.1}, {"name": "demo:chat", "eval_split": 0.05},
                 eval_max_samples=50)
    assert len(build_datasets(capped, tokenizer, tmp_path)[1]) == 50


def test_interleave_follows_the_probabilities_and_uses_each_source_evenly():
    a = mixture.tagged(Dataset.from_dict({"input_ids": [[i] for i in range(10)]}), 0)
    b = mixture.tagged(Dataset.from_dict({"input_ids": [[100 + i, 0] for i in range(1000)]}), 1)
    mixed = mixture.interleave([a, b], [0.5, 0.5], seed=1)
    assert len(mixed) == 1010
    sources = mixed[mixture.SOURCE]
    assert shares(sources, 2)[0] == pytest.approx(0.5, abs=0.05)
    small = [ids[0] for ids, s in zip(mixed["input_ids"], sources, strict=True) if s == 0]
    counts = np.bincount(small, minlength=10)
    assert counts.max() - counts.min() <= 1  # oversampled: every example once before any twice
    large = [ids[0] for ids, s in zip(mixed["input_ids"], sources, strict=True) if s == 1]
    assert len(set(large)) == len(large)  # undersampled: no repeats
    assert mixture.interleave([a, b], [0.5, 0.5], seed=1)["input_ids"] == mixed["input_ids"]
    assert mixture.mean_tokens(b) == 2.0
    assert mixture.mixture_probabilities([1, 1], [1.0, 2.0], "tokens") == pytest.approx([2 / 3, 1 / 3])
    assert mixture.mixture_probabilities([3, 1], [1.0, 2.0], "examples") == pytest.approx([0.75, 0.25])


@pytest.mark.parametrize("packing", [False, True])
def test_the_collator_counts_each_sources_tokens_and_drops_the_column(tokenizer, tmp_path, packing):
    recipe = mix({"name": "demo:facts"}, {"name": "demo:chat"}, packing=packing)
    train, _ = build_datasets(recipe, tokenizer, tmp_path)
    collate = mixture.SourceTokens(make_collator(recipe, tokenizer), 2)
    features = [train[i] for i in range(8)]
    batch = collate(features)
    assert mixture.SOURCE not in batch
    expected = [sum(len(f["input_ids"]) for f in features if f[mixture.SOURCE] == k) for k in (0, 1)]
    assert batch[mixture.SOURCE_TOKENS].tolist() == expected
    if not packing:
        assert int(batch["attention_mask"].sum()) == sum(expected)
    plain = collate([{k: v for k, v in f.items() if k != mixture.SOURCE} for f in features])
    assert mixture.SOURCE_TOKENS not in plain


def test_a_resumed_mixture_goes_on_from_the_checkpoints_row(tmp_path):
    from tuiapp.core.run_folder.metrics import JsonlWriter
    from tuiapp.trainer.loop.callbacks import _source_tokens_at

    path = tmp_path / "metrics.jsonl"
    assert _source_tokens_at(path, 10, ["facts", "chat"]) == {}
    with JsonlWriter(path) as writer:
        for step in (5, 10, 15):
            writer.write({"step": step, "loss": 1.0, "tokens": 40 * step, "tokens/facts": 30 * step,
                          "tokens/chat": 10 * step})
        writer.write({"split": "eval", "step": 10, "eval_loss": 1.0})
    assert _source_tokens_at(path, 12, ["facts", "chat"]) == {"facts": 300, "chat": 100}


def test_the_preview_shows_each_source_in_turn(tokenizer):
    shown = data.preview_examples(mix({"name": "demo:facts"}, {"name": "demo:chat"}), tokenizer, 4)
    facts = data.preview_examples(mix({"name": "demo:facts"}, {"name": "demo:text", "label": "x"}), tokenizer, 1)
    assert len(shown) == 4 and shown[0]["text"] == facts[0]["text"]
    assert shown[1]["text"].count("<|im_start|>user") > 1  # a multi-turn chat from the second source


def test_a_streamed_mixture_is_refused_in_the_rank_too(tokenizer, tmp_path):
    from tuiapp.core.common.errors import DatasetError
    from tuiapp.trainer.dataset import streaming

    recipe = Recipe.model_validate({"method": {"kind": "sft"}, "train": {"max_steps": 3},
                                    "dataset": {"streaming": True, "sources": [{"name": "demo:facts"}]}})
    with pytest.raises(DatasetError) as info:
        streaming.build_datasets(recipe, tokenizer, tmp_path)
    assert info.value.key == "dataset.streaming" and "streaming = false" in info.value.fix
