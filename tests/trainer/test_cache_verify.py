"""Tokenization cache entries that verify themselves: sizes and sha256 recorded at write, a damaged
entry detected on load (named with its path), rebuilt, and shown as damaged by `llmtui cache list`.
Real entries built by build_datasets, damaged on disk as a crash or a bad disk would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tuiapp.core.config.recipe import Recipe
from tuiapp.core.data import cache_entry
from tuiapp.trainer.dataset import tokenize_cache
from tuiapp.trainer.dataset.data import build_datasets

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def recipe() -> Recipe:
    return Recipe.model_validate({"dataset": {"name": "demo:facts"}, "method": {"kind": "sft"},
                                  "train": {"max_seq_len": 64}})


def the_entry(cache: Path) -> Path:
    [entry] = [p for p in (cache / "data").iterdir() if not p.name.startswith(".")]
    return entry


def arrow_file(entry: Path) -> Path:
    return sorted(entry.rglob("*.arrow"))[0]


def cache_list(cache: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "tuiapp.cli", "cache", "list", "--json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "LLMTUI_CACHE": str(cache)})
    return json.loads(out.stdout)


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def flip_a_byte(path: Path) -> None:
    with open(path, "r+b") as handle:
        handle.seek(path.stat().st_size // 2)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.slow  # two builds and a CLI process: ~10 s on 2 cores
def test_a_damaged_entry_is_named_listed_and_rebuilt(tmp_path, tokenizer, capsys):
    cache = tmp_path / "cache"
    train, _ = build_datasets(recipe(), tokenizer, cache)
    expected = list(train["input_ids"])  # read before the damage: the dataset maps the entry's file
    del train
    entry = the_entry(cache)
    manifest = tokenize_cache.entry_info(entry)["manifest"]
    assert manifest and all(f["bytes"] > 0 and len(f["sha256"]) == 64 for f in manifest.values())
    assert cache_entry.state(entry) == ("ok", None)
    damaged = arrow_file(entry)
    flip_a_byte(damaged)  # same size, other bytes: the checksum sees it
    assert "sha256 differs" in cache_entry.problem(entry) and cache_entry.problem(entry, checksums=False) is None
    flip_a_byte(damaged)
    truncate(damaged)

    [listed] = cache_list(cache)["entries"]
    assert listed["state"] == "damaged" and str(damaged) in listed["problem"]
    assert "truncated or overwritten" in listed["problem"]

    capsys.readouterr()
    again, _ = build_datasets(recipe(), tokenizer, cache)
    out = capsys.readouterr().out
    assert f"tokenized cache entry {entry} is damaged" in out and "truncated" in out and "rebuilt" in out
    assert again["input_ids"] == expected
    assert the_entry(cache) == entry and cache_entry.state(entry) == ("ok", None)


@pytest.mark.slow  # two builds: ~5 s on 2 cores
def test_an_entry_without_a_manifest_is_checked_by_loading_it(tmp_path, tokenizer, capsys):
    """Written before manifests: a truncated Arrow file fails Arrow's own reading, and is rebuilt."""
    cache = tmp_path / "cache"
    train, _ = build_datasets(recipe(), tokenizer, cache)
    expected = list(train["input_ids"])
    del train
    entry = the_entry(cache)
    info = tokenize_cache.entry_info(entry)
    del info["manifest"]
    (entry / cache_entry.ENTRY_INFO).write_text(json.dumps(info))
    assert cache_entry.state(entry)[0] == "unverified"
    truncate(arrow_file(entry))
    capsys.readouterr()
    again, _ = build_datasets(recipe(), tokenizer, cache)
    assert "cannot be read" in capsys.readouterr().out
    assert again["input_ids"] == expected and cache_entry.problem(entry) is None
