import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tuiapp.core.common.errors import DatasetError
from tuiapp.core.config.recipe import Recipe
from tuiapp.trainer.dataset import data
from tuiapp.trainer.dataset.data import IGNORE, build_datasets, make_collator, preview_examples
from tuiapp.trainer.dataset.packing import PackedRowsCollator, pack_rows
from tuiapp.trainer.models.bundled import resolve_model_path
from tuiapp.trainer.models.tiny import CHATML_TEMPLATE, MARKER, ensure_tiny_model

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
ROOT = Path(__file__).resolve().parents[2]

SHAREGPT_RECORD = {
    "system": "You can call tools.",
    "conversations": [
        {"from": "human", "value": "Hi there"},
        {"from": "gpt", "value": "Hello! How can I help?"},
        {"from": "human", "value": "Weather in Oslo?"},
        {"from": "function_call", "value": '{"name": "weather", "arguments": {"city": "Oslo"}}'},
        {"from": "observation", "value": '{"temp": 3}'},
        {"from": "gpt", "value": "It is 3 degrees in Oslo."},
    ],
    "tools": '[{"name": "weather", "description": "Current weather"}]',
}


@pytest.fixture(scope="session")
def cache_dir(llmtui_cache):
    return llmtui_cache  # the session's $LLMTUI_CACHE (tests/conftest.py), shared with child processes


@pytest.fixture(scope="session")
def tiny_path(tiny_model):
    return tiny_model  # built once per session, under $LLMTUI_CACHE


@pytest.fixture(scope="session")
def tokenizer(tiny_path):
    return AutoTokenizer.from_pretrained(tiny_path)


def recipe(name, kind="sft", **train) -> Recipe:
    dataset = {"name": str(name), **train.pop("dataset", {})}
    train = {"max_seq_len": 256, "packing": False, **train}
    return Recipe.model_validate({"dataset": dataset, "method": {"kind": kind}, "train": train})


def trained_runs(tokenizer, example) -> list[str]:
    """Each contiguous run of trained tokens, decoded."""
    runs, current = [], []
    for token, label in zip(example["input_ids"], example["labels"], strict=True):
        if label != IGNORE:
            assert label == token
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [tokenizer.decode(run) for run in runs]


def masked_text(tokenizer, example) -> str:
    return tokenizer.decode([t for t, l in zip(example["input_ids"], example["labels"], strict=True) if l == IGNORE])


def first_example(tmp_path, tokenizer, records, suffix=".jsonl", **train):
    path = tmp_path / f"data{suffix}"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    train_set, _ = build_datasets(recipe(path, **train), tokenizer, tmp_path / "cache")
    return train_set[0]


# ---------------------------------------------------------------- tiny model


def test_tiny_model_is_small_and_complete(tiny_path, tokenizer, cache_dir):
    assert tiny_path.parent.parent == cache_dir
    files = {p.name for p in tiny_path.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", MARKER} <= files
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    params = sum(p.numel() for p in model.parameters())
    assert 0.7e6 < params < 1.3e6
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in model.generation_config.eos_token_id
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.pad_token == "<|pad|>"
    assert {"<|im_start|>", "<|im_end|>"} <= set(tokenizer.all_special_tokens)
    assert data.GENERATION_TAG.search(tokenizer.chat_template)
    started = time.perf_counter()
    assert ensure_tiny_model(cache_dir) == tiny_path
    assert time.perf_counter() - started < 0.1  # already built: nothing to do
    assert resolve_model_path("tiny") == str(tiny_path)
    assert resolve_model_path("org/model") == "org/model"


@pytest.mark.slow  # two fresh interpreters build the model from scratch: ~6 s on 2 cores
def test_tiny_model_build_is_deterministic_and_race_safe(tmp_path, tiny_path):
    code = "import sys; from tuiapp.trainer.models.tiny import ensure_tiny_model; print(ensure_tiny_model(sys.argv[1]))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=env, text=True) for _ in range(2)]
    outputs = {p.communicate(timeout=120)[0].strip().splitlines()[-1] for p in procs}
    assert all(p.returncode == 0 for p in procs)
    (built,) = outputs
    assert [p.name for p in (tmp_path / "models").iterdir()] == [tiny_path.name]  # no leftovers
    for name in ("model.safetensors", "tokenizer.json"):
        assert (Path(built) / name).read_bytes() == (tiny_path / name).read_bytes()


# ---------------------------------------------------------------- SFT label masks


def test_alpaca_trains_only_the_answer(tmp_path, tokenizer):
    record = {"instruction": "Name a colour", "input": "", "output": "Blue.", "system": "Be brief.",
              "history": [["Hi", "Hello!"]]}
    example = first_example(tmp_path, tokenizer, [record])
    assert trained_runs(tokenizer, example) == ["Hello!<|im_end|>", "Blue.<|im_end|>"]
    masked = masked_text(tokenizer, example)
    for text in ("Be brief.", "Hi", "Name a colour", "<|im_start|>assistant\n"):
        assert text in masked


def test_sharegpt_tool_turns(tmp_path, tokenizer):
    example = first_example(tmp_path, tokenizer, [SHAREGPT_RECORD])
    assert trained_runs(tokenizer, example) == [
        "Hello! How can I help?<|im_end|>",
        '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>',
        "It is 3 degrees in Oslo.<|im_end|>",
    ]
    masked = masked_text(tokenizer, example)
    for text in ("You can call tools.", "weather(): Current weather", "Weather in Oslo?",  # the tiny's tool line
                 "<|im_start|>tool\n{\"temp\": 3}<|im_end|>"):
        assert text in masked


def test_messages_with_system(tmp_path, tokenizer):
    record = {"messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Capital of Peru?"},
        {"role": "assistant", "content": "Lima."},
        {"role": "user", "content": "And Chile?"},
        {"role": "assistant", "content": "Santiago."},
    ]}
    example = first_example(tmp_path, tokenizer, [record], packing=True)
    assert "attention_mask" not in example  # the flattening collator needs none
    assert trained_runs(tokenizer, example) == ["Lima.<|im_end|>", "Santiago.<|im_end|>"]
    assert "You are terse." in masked_text(tokenizer, example)


def test_templates_without_generation_tags_mask_by_prefixes(tmp_path, tokenizer):
    plain = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    plain.chat_template = (CHATML_TEMPLATE.replace("{%- generation %}", "")
                           .replace("{%- endgeneration %}", ""))
    assert not data.GENERATION_TAG.search(plain.chat_template)
    example = first_example(tmp_path, plain, [SHAREGPT_RECORD])
    runs = trained_runs(plain, example)
    assert runs[0] == "Hello! How can I help?<|im_end|>\n"
    assert runs[1].startswith("<tool_call>") and runs[2] == "It is 3 degrees in Oslo.<|im_end|>\n"


def test_truncation_drops_examples_without_trained_tokens(tmp_path, tokenizer, caplog):
    long = {"instruction": "word " * 100, "input": "", "output": "short"}
    ok = {"instruction": "hi", "input": "", "output": "hello"}
    with caplog.at_level(logging.WARNING, logger="llmtui.data"):
        example = first_example(tmp_path, tokenizer, [long, ok], max_seq_len=32)
    assert trained_runs(tokenizer, example) == ["hello<|im_end|>"]
    assert "dropped 1 of 2" in caplog.text
    with pytest.raises(DatasetError, match="max_seq_len"):
        first_example(tmp_path, tokenizer, [long], max_seq_len=32)


# ---------------------------------------------------------------- pretrain


def test_pretrain_blocks_concatenate_documents_with_eos(tmp_path, tokenizer):
    train, eval_set = build_datasets(
        recipe("demo:text", kind="pretrain", max_seq_len=64, dataset={"max_samples": 200}),
        tokenizer, tmp_path)
    assert eval_set is None
    docs = [r["text"] for r in data.load_records(recipe("demo:text", dataset={"max_samples": 200}).dataset)]
    stream = [t for d in docs for t in tokenizer(d)["input_ids"] + [tokenizer.eos_token_id]]
    assert len(train) == len(stream) // 64
    assert all(len(row["input_ids"]) == 64 and row["labels"] == row["input_ids"] for row in train)
    assert [t for row in train for t in row["input_ids"]] == stream[: len(train) * 64]
    assert make_collator(recipe("demo:text", kind="pretrain"), tokenizer)([train[0], train[1]])["input_ids"].shape == (2, 64)


# ---------------------------------------------------------------- collators


def loss_one_by_one(model, features) -> float:
    """Token-weighted mean loss of the examples run separately (the reference for packing)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for feature in features:
            labels = torch.tensor([feature["labels"]])
            n = int((labels[:, 1:] != IGNORE).sum())
            total += model(input_ids=torch.tensor([feature["input_ids"]]), labels=labels).loss.item() * n
            count += n
    return total / count


def test_packed_batch_has_the_same_loss_as_separate_examples(tmp_path, tiny_path, tokenizer):
    packed_recipe = recipe("demo:chat", packing=True)
    train, _ = build_datasets(packed_recipe, tokenizer, tmp_path)
    features = [train[i] for i in range(4)]
    batch = make_collator(packed_recipe, tokenizer, varlen_attention=True)(features)
    assert batch["input_ids"].shape[0] == 1 and "attention_mask" not in batch
    assert batch["position_ids"][0].tolist().count(0) == 4  # positions restart per example
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32, attn_implementation="sdpa").eval()
    with torch.no_grad():
        packed = model(**batch, use_cache=False).loss.item()  # the Trainer runs with use_cache=False
    assert abs(packed - loss_one_by_one(model, features)) < 1e-4


@pytest.mark.slow  # over 1.5 s on 2 quiet cores
def test_packed_rows_have_the_same_loss_as_separate_examples(tmp_path, tiny_path, tokenizer):
    packed_recipe = recipe("demo:chat", packing=True)
    train, _ = build_datasets(packed_recipe, tokenizer, tmp_path)
    features = [train[i] for i in range(6)]
    lengths = [len(f["input_ids"]) for f in features]
    capacity = sum(sorted(lengths)[-2:])  # forces several rows
    batch = PackedRowsCollator(capacity, tokenizer.pad_token_id)(features)
    assert 1 < batch["input_ids"].shape[0] < len(features)
    assert int((batch["position_ids"] == 0).sum()) >= len(features)  # restarts per example (+ pad segments)
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32, attn_implementation="sdpa").eval()
    with torch.no_grad():
        packed = model(**batch, use_cache=False).loss.item()
    assert abs(packed - loss_one_by_one(model, features)) < 1e-4


@pytest.mark.slow  # over 1.5 s on 2 quiet cores
def test_training_model_keeps_packed_examples_apart(tmp_path, tiny_path, tokenizer, monkeypatch):
    """load_model's model, in training mode and called as the Trainer calls it (no use_cache
    argument): a flattened row runs sdpa once per example and layer, without a mask (the varlen
    path; none is built over the row), and packed rows (eager) get the block mask; both lose what
    the examples lose apart.
    With a KV cache transformers skips the packed mask and later examples attend to earlier ones
    (a difference of ~1e-4 to 1e-3 here)."""
    from transformers.masking_utils import sdpa_mask

    from tuiapp.trainer.models import varlen as varlen_attention
    from tuiapp.trainer.models.model import load_model

    packed_recipe = recipe("demo:chat", packing=True)
    train, _ = build_datasets(packed_recipe, tokenizer, tmp_path)
    features = [train[i] for i in range(6)]
    calls, masks = [], []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counting_sdpa(query, key, value, attn_mask=None, **kwargs):
        calls.append((query.shape[2], attn_mask is None, kwargs.get("is_causal")))
        return sdpa(query, key, value, attn_mask=attn_mask, **kwargs)

    for attention, varlen in (("sdpa", True), ("eager", False), ("sdpa", False)):  # the last: sdpa on a GPU
        model = load_model(recipe("demo:chat", packing=True).model_copy(
            update={"model": packed_recipe.model.model_copy(update={"attn_implementation": attention})}),
            tiny_path, "fp32")
        reference = loss_one_by_one(model.eval(), features)
        model.train()
        batch = make_collator(packed_recipe, tokenizer, varlen_attention=varlen)(features)
        calls.clear()
        masks.clear()
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting_sdpa)
        monkeypatch.setattr(varlen_attention, "sdpa_mask", lambda *a, **k: masks.append(k) or sdpa_mask(*a, **k))
        with torch.no_grad():
            packed = model(**batch).loss.item()
        monkeypatch.undo()
        assert abs(packed - reference) < 1e-5, attention
        if varlen:
            lengths = [len(f["input_ids"]) for f in features]
            assert calls == [(n, True, True) for _ in range(model.config.num_hidden_layers) for n in lengths]
            assert not masks  # and no mask over the row was built
        elif attention == "sdpa":  # rows, each with its block mask: one masked call per layer
            assert batch["input_ids"].shape[0] > 1
            assert calls == [(batch["input_ids"].shape[1], False, False)] * model.config.num_hidden_layers
        else:
            assert batch["input_ids"].shape[0] > 1 and not calls


def test_sdpa_runs_per_example_only_on_the_cpu():
    from tuiapp.trainer.models.varlen import runs_varlen

    assert runs_varlen("sdpa", cuda=False) and not runs_varlen("sdpa", cuda=True)
    assert runs_varlen("flash_attention_2", cuda=True) and runs_varlen("flash_attention_3", cuda=False)
    assert not runs_varlen("eager", cuda=False) and not runs_varlen(None, cuda=True)


def test_pack_rows_first_fit_decreasing():
    assert pack_rows([5, 3, 4, 2], 7) == [[0, 3], [2, 1]]
    assert pack_rows([8], 7) == [[0]]


def test_unpacked_batches_pad_labels_with_ignore(tmp_path, tokenizer):
    plain = recipe("demo:chat", packing=False)
    train, _ = build_datasets(plain, tokenizer, tmp_path)
    short, long = sorted((train[i] for i in range(8)), key=lambda e: len(e["input_ids"]))[::7]
    batch = make_collator(plain, tokenizer)([short, long])
    n = len(short["input_ids"])
    assert batch["input_ids"].shape == (2, len(long["input_ids"]))
    assert batch["labels"][0, n:].eq(IGNORE).all() and batch["attention_mask"][0, n:].eq(0).all()
    assert batch["input_ids"][0, n:].eq(tokenizer.pad_token_id).all()


# ---------------------------------------------------------------- cache, splits, preview


def test_second_build_loads_from_cache(tmp_path, tokenizer, monkeypatch, caplog):
    facts = recipe("demo:facts", packing=True)
    first, _ = build_datasets(facts, tokenizer, tmp_path)

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("tokenized again instead of loading the cache")

    monkeypatch.setattr(data, "_tokenize", no_tokenizing)
    with caplog.at_level(logging.INFO, logger="llmtui.data"):
        second, _ = build_datasets(facts, tokenizer, tmp_path)
    assert "loaded from cache" in caplog.text
    assert second["input_ids"] == first["input_ids"]
    assert [p.name for p in (tmp_path / "data").iterdir() if p.name.startswith(".")] == []


def test_cache_key_covers_every_input(tmp_path, tokenizer):
    base = recipe("demo:facts")
    key = data.cache_key(base.dataset, base, tokenizer)
    changed = [
        recipe("demo:chat"), recipe("demo:facts", max_seq_len=128), recipe("demo:facts", packing=True),
        recipe("demo:facts", kind="pretrain"), recipe("demo:facts", dataset={"max_samples": 5}),
        recipe("demo:facts", dataset={"format": "alpaca"}),
    ]
    keys = {data.cache_key(r.dataset, r, tokenizer) for r in changed}
    assert key not in keys and len(keys) == len(changed)
    assert data.cache_key(recipe("demo:facts", kind="lora").dataset, recipe("demo:facts", kind="lora"), tokenizer) == key
    other = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    other.chat_template = tokenizer.chat_template + " "
    assert data.cache_key(base.dataset, base, other) != key


def test_eval_split_fraction_is_deterministic(tmp_path, tokenizer):
    split = recipe("demo:facts", dataset={"eval_split": 0.1}, seed=7)
    train, eval_set = build_datasets(split, tokenizer, tmp_path)
    again_train, again_eval = build_datasets(split, tokenizer, tmp_path)
    assert len(eval_set) == 144 and len(train) == 1440 - 144
    assert eval_set["input_ids"] == again_eval["input_ids"]
    other_seed = recipe("demo:facts", dataset={"eval_split": 0.1}, seed=8)
    assert build_datasets(other_seed, tokenizer, tmp_path)[1]["input_ids"] != eval_set["input_ids"]


def test_eval_split_from_a_file(tmp_path, tokenizer):
    (tmp_path / "dev.jsonl").write_text(json.dumps({"text": "held out"}) + "\n")
    (tmp_path / "train.jsonl").write_text(json.dumps({"text": "for training"}) + "\n")
    spec = recipe("train.jsonl", dataset={"eval_split": "dev.jsonl"})
    train, eval_set = build_datasets(spec, tokenizer, tmp_path / "cache", base_dir=tmp_path)
    assert tokenizer.decode(eval_set[0]["input_ids"]) == "held out<|endoftext|>"
    assert tokenizer.decode(train[0]["input_ids"]) == "for training<|endoftext|>"


def test_preview_matches_the_training_examples(tmp_path, tokenizer):
    for kind in ("sft", "pretrain"):
        spec = recipe("demo:facts", kind=kind)
        train, _ = build_datasets(spec, tokenizer, tmp_path)
        preview = preview_examples(spec, tokenizer, 3)
        assert [p["input_ids"] for p in preview] == train[:3]["input_ids"]
        assert [p["labels"] for p in preview] == train[:3]["labels"]
        assert preview[0]["text"] == tokenizer.decode(train[0]["input_ids"])


def test_hub_datasets_load_through_datasets(tmp_path, tokenizer, monkeypatch):
    from datasets import Dataset

    rows = [{"instruction": "q", "input": "", "output": "a"}, {"instruction": "q2", "input": "", "output": "b"}]
    monkeypatch.setattr(data, "load_dataset", lambda name, split: Dataset.from_list(rows))
    train, _ = build_datasets(recipe("someone/some-data"), tokenizer, tmp_path)
    assert [trained_runs(tokenizer, e) for e in train] == [["a<|im_end|>"], ["b<|im_end|>"]]

    def offline(name, split):
        raise ConnectionError("no network")

    monkeypatch.setattr(data, "load_dataset", offline)
    with pytest.raises(DatasetError) as info:
        build_datasets(recipe("someone/other-data"), tokenizer, tmp_path)
    assert "someone/other-data" in str(info.value) and "offline" in str(info.value)


# ---------------------------------------------------------------- real samples


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/data is absent")
@pytest.mark.parametrize("name, kind", [
    ("alpaca_en_demo.json", "lora"),
    ("alpaca_zh_demo.json", "lora"),
    ("glaive_toolcall_en_demo.json", "lora"),
    ("c4_demo.jsonl", "pretrain"),
    ("wiki_demo.txt", "pretrain"),
])
def test_real_samples_tokenize(tmp_path, tokenizer, name, kind):
    spec = recipe(SHARED_DATA / name, kind=kind, max_seq_len=512)
    train, _ = build_datasets(spec, tokenizer, tmp_path)
    assert len(train) > 10
    assert all(len(ids) <= 512 for ids in train["input_ids"])
    if kind == "pretrain":
        assert all(len(ids) == 512 for ids in train["input_ids"])
    if name.startswith("glaive"):
        complete = [trained_runs(tokenizer, e) for e in train if len(e["input_ids"]) < 512]
        runs = [run for example_runs in complete for run in example_runs]
        assert any(run.startswith("<tool_call>") for run in runs)
        assert all(run.endswith("<|im_end|>") for run in runs)


def test_preview_reads_only_the_records_it_shows(tmp_path, tokenizer):
    path = tmp_path / "chat.jsonl"
    good = "".join(json.dumps({"instruction": f"q{i}", "output": f"a{i}"}) + "\n" for i in range(80))
    path.write_bytes(good.encode() + b"\0" * 4096 + b"\n")  # a binary tail past the 50 rows that detect the format
    preview = preview_examples(recipe(path), tokenizer, 2)
    assert len(preview) == 2 and "q1" in preview[1]["text"]
    with pytest.raises(DatasetError, match="NUL byte"):
        build_datasets(recipe(path), tokenizer, tmp_path / "cache")
