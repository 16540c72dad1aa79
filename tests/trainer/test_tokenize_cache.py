"""Tokenization as its own step: parallel worker processes (the same blocks as one process),
progress in the rank's phase record, one build shared by concurrent ranks, and `llmtui cache
list|prune`. Real datasets.map workers, real processes, real files."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from transformers import AutoTokenizer

from tuiapp.core.config.recipe import Recipe
from tuiapp.core.run_folder import rundir
from tuiapp.trainer import phases
from tuiapp.trainer.dataset import tokenize_cache
from tuiapp.trainer.dataset.data import build_datasets

ROOT = Path(__file__).resolve().parents[2]
DOCS = 3000


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": f"document {i}: " + "the quick brown fox " * (1 + i % 17)}) + "\n"
                            for i in range(DOCS)))
    return path


def recipe(name, kind="pretrain") -> Recipe:
    return Recipe.model_validate({"dataset": {"name": str(name)}, "method": {"kind": kind},
                                  "train": {"max_seq_len": 64}})


@pytest.mark.slow  # over ~5 s on 2 cores
def test_workers_tokenize_the_same_blocks_as_one_process(tmp_path, tokenizer, corpus, monkeypatch):
    monkeypatch.setenv("LLMTUI_TOKENIZE_WORKERS", "1")
    one, _ = build_datasets(recipe(corpus), tokenizer, tmp_path / "one")
    monkeypatch.setenv("LLMTUI_TOKENIZE_WORKERS", "2")
    two, _ = build_datasets(recipe(corpus), tokenizer, tmp_path / "two")
    assert len(one) > 100 and one["input_ids"] == two["input_ids"]
    facts_one, _ = build_datasets(recipe("demo:facts", "sft"), tokenizer, tmp_path / "one")
    monkeypatch.setenv("LLMTUI_TOKENIZE_WORKERS", "1")
    facts_two, _ = build_datasets(recipe("demo:facts", "sft"), tokenizer, tmp_path / "two")
    assert facts_one["labels"] == facts_two["labels"]
    info = tokenize_cache.entry_info(next((tmp_path / "one" / "data").iterdir()))
    assert info["rows"] > 0 and info["source"]


def test_progress_is_in_the_phase_record(tmp_path, tokenizer, corpus, monkeypatch):
    monkeypatch.setenv("LLMTUI_TOKENIZE_WORKERS", "2")
    monkeypatch.setattr(tokenize_cache, "PROGRESS_EVERY_S", 0.02)
    monkeypatch.setitem(phases._state, "run_dir", None)
    monkeypatch.setitem(phases._state, "rank", 0)
    phases._state.update(run_dir=tmp_path / "run")
    phases.enter("tokenizing")
    try:
        build_datasets(recipe(corpus), tokenizer, tmp_path / "cache")
    finally:
        phases._state.update(run_dir=None, phase=None)
    record = rundir.read_phases(tmp_path / "run")[0]
    figure = record["progress"]
    assert record["phase"] == "tokenizing" and figure["total"] == DOCS and 0 < figure["done"] <= DOCS
    assert figure["workers"] == 2 and figure["docs_per_s"] > 0 and figure["mb_per_s"] > 0


BUILD = """
import logging, sys
from transformers import AutoTokenizer
from tuiapp.core.config.recipe import Recipe
from tuiapp.trainer.dataset.data import build_datasets
logging.basicConfig(level=logging.INFO)
recipe = Recipe.model_validate({"dataset": {"name": sys.argv[1]}, "method": {"kind": "pretrain"},
                                "train": {"max_seq_len": 64}})
train, _ = build_datasets(recipe, AutoTokenizer.from_pretrained(sys.argv[2]), sys.argv[3])
print("rows", len(train))
"""


@pytest.mark.slow
def test_concurrent_ranks_share_one_build(tmp_path, tiny_model, corpus):
    cache = tmp_path / "cache"
    procs = [subprocess.Popen([sys.executable, "-c", BUILD, str(corpus), str(tiny_model), str(cache)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert sorted("loaded from cache" in out for out in outs) == [False, True], outs
    assert len({line for out in outs for line in out.splitlines() if line.startswith("rows")}) == 1
    assert len(list((cache / "data").iterdir())) == 1


def llmtui(*args: str, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuiapp.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "LLMTUI_CACHE": str(cache)})


@pytest.mark.slow  # over ~5 s on 2 cores
def test_cache_list_and_prune(tmp_path, tokenizer, corpus):
    cache = tmp_path / "cache"
    build_datasets(recipe(corpus), tokenizer, cache)
    build_datasets(recipe("demo:facts", "sft"), tokenizer, cache)
    listed = json.loads(llmtui("cache", "list", "--json", cache=cache).stdout)
    assert len(listed["entries"]) == 2 and listed["bytes"] > 0
    old, new = sorted(listed["entries"], key=lambda e: e["source"] != str(corpus))
    assert old["source"] == str(corpus) and old["method"] == "pretrain" and old["rows"] > 0
    info_path = Path(old["path"]) / tokenize_cache.ENTRY_INFO
    info = json.loads(info_path.read_text())
    info_path.write_text(json.dumps({**info, "used": time.time() - 40 * 86400}))  # last used 40 days ago
    assert old["key"] in llmtui("cache", "list", cache=cache).stdout and "40d" not in old["key"]
    dry = llmtui("cache", "prune", "--older-than", "30", "--dry-run", cache=cache)
    assert dry.returncode == 0 and "would remove 1 entries" in dry.stdout and Path(old["path"]).is_dir()
    lock = cache / "locks" / f"data-{old['key']}.lock"
    with open(lock, "a+") as handle:  # a rank building it holds this lock
        fcntl.flock(handle, fcntl.LOCK_EX)
        busy = llmtui("cache", "prune", "--older-than", "30", cache=cache)
        fcntl.flock(handle, fcntl.LOCK_UN)
    assert "a run is using it" in busy.stdout and Path(old["path"]).is_dir()
    done = llmtui("cache", "prune", "--older-than", "30", cache=cache)
    assert "removed 1 entries" in done.stdout and not Path(old["path"]).exists() and Path(new["path"]).is_dir()
    assert llmtui("cache", "prune", cache=cache).returncode == 2


def test_the_blocks_are_cut_across_files_and_batches_and_moved_into_the_entry(tmp_path, tokenizer, corpus, monkeypatch):
    """The cold build reads the documents' ids file by file, in batches that do not line up with
    the documents per block batch, and moves the blocks' file into the entry (no copy of the rows):
    the same blocks as cutting each batch of documents in Python."""
    from tuiapp.trainer.dataset import data

    monkeypatch.setenv("LLMTUI_TOKENIZE_WORKERS", "2")
    monkeypatch.setattr(data, "DOCS_PER_BLOCK_BATCH", 333)  # batches across the workers' files and theirs
    monkeypatch.setattr(data, "RECORD_BATCH_BYTES", 4 * 64 * 1024)  # record batches of 1,024 blocks of 64
    train, _ = build_datasets(recipe(corpus), tokenizer, tmp_path / "cache")
    texts = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
    entry = next((tmp_path / "cache" / "data").iterdir())
    info = tokenize_cache.entry_info(entry)
    assert info["files"] == ["data-00000.arrow"] and not (entry / "state.json").exists()
    assert sorted(p.name for p in entry.iterdir()) == ["data-00000.arrow", tokenize_cache.ENTRY_INFO]
    cached = tokenize_cache.load_entry(entry)
    expected = []
    for start in range(0, len(texts), 333):
        expected += data._blocks(data._document_ids({"text": texts[start:start + 333]}, tokenizer), 64)["input_ids"]
    assert cached["input_ids"] == expected and cached["labels"] == expected
    with pa.OSFile(str(entry / "data-00000.arrow")) as source:  # whole record batches of 8 MB a column
        batches = [batch.num_rows for batch in pa.ipc.open_stream(source)]
    assert batches[:-1] == [1024] * (len(batches) - 1) and 0 < batches[-1] <= 1024 and len(batches) > 1
    assert set(map(tuple, train["input_ids"])) <= set(map(tuple, expected))
