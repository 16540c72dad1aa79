"""dataset.streaming: the stream yields the examples the cached path builds, in file order, without
building a cache entry; and preflight refuses what a stream cannot do, naming the key and the fix."""

import json

import pytest
from transformers import AutoTokenizer

from tuiapp.core.config.recipe import Recipe
from tuiapp.core.data import demo_data
from tuiapp.core.prelaunch.recipe_rules import streaming_rules
from tuiapp.trainer.dataset import streaming
from tuiapp.trainer.dataset.data import build_datasets
from tuiapp.trainer.dataset.streaming import TokenizedStream


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _recipe(data, kind, **dataset) -> Recipe:
    return Recipe.model_validate({"dataset": {"name": str(data), **dataset}, "method": {"kind": kind},
                                  "train": {"max_seq_len": 64, "max_steps": 5, "packing": False}})


@pytest.mark.parametrize("kind, records", [
    ("pretrain", demo_data.text_records(2500)),  # more documents than one batch: blocks cut per batch, as cached
    ("sft", demo_data.facts_records()[:300]),
])
def test_the_stream_is_the_cached_examples_in_file_order(tmp_path, tokenizer, kind, records):
    data = _jsonl(tmp_path / "data.jsonl", records)
    cached, _ = build_datasets(_recipe(data, kind), tokenizer, tmp_path / "cache")
    stream, held_out = streaming.build_datasets(_recipe(data, kind, streaming=True), tokenizer,
                                                tmp_path / "cache-streaming")
    assert isinstance(stream, TokenizedStream) and held_out is None
    assert not (tmp_path / "cache-streaming" / "data").exists()  # nothing tokenized ahead
    streamed = list(stream)
    assert len(streamed) == len(cached)
    assert streamed == [cached[i] for i in range(len(cached))]


def test_max_samples_bounds_the_stream(tmp_path, tokenizer):
    data = _jsonl(tmp_path / "data.jsonl", demo_data.facts_records()[:100])
    stream, _ = streaming.build_datasets(_recipe(data, "sft", streaming=True, max_samples=7), tokenizer,
                                         tmp_path / "cache")
    assert len(list(stream)) == 7


def _rules(**parts) -> dict[str, str]:
    recipe = Recipe.model_validate({"dataset": {"name": "data.jsonl", "streaming": True, **parts.pop("dataset", {})},
                                    "method": {"kind": parts.pop("kind", "pretrain")},
                                    "train": {"max_steps": 10, **parts.pop("train", {})},
                                    "launch": parts.pop("launch", {})})
    return {f.key: f"{f.message} | {f.fix}" for f in streaming_rules(recipe) if f.level == "error"}


def test_preflight_keeps_streaming_to_what_a_stream_can_do():
    assert _rules() == {}
    assert _rules(dataset={"eval_split": "eval.jsonl"}, train={"eval_steps": 5}) == {}
    assert "epochs cannot be counted" in _rules(train={"max_steps": 0})["train.max_steps"]
    assert "fraction" in _rules(dataset={"eval_split": 0.1})["dataset.eval_split"]
    asked = _rules(train={"eval_steps": 5})["dataset.eval_split"]  # no automatic fraction for a stream
    assert "holds nothing out" in asked and "eval file" in asked
    assert "sample_prompts" in _rules(train={"sample_prompts": ["hi"]})["dataset.eval_split"]
    assert "batching = 'examples'" in _rules(kind="sft", train={"batching": "tokens"})["train.batching"]
    assert "a number" in _rules(kind="sft", train={"micro_batch": "auto"})["train.micro_batch"]
    assert "deepspeed strategy" in _rules(launch={"strategy": "pipeline"})["launch.strategy"]
    assert "streaming = false" in _rules(kind="dpo")["dataset.streaming"]
    assert "streaming = false" in _rules(kind="grpo")["dataset.streaming"]
