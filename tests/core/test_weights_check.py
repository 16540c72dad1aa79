"""Weights that cannot be read are refused before launch, naming the file: a truncated, random or
empty model.safetensors, a shard an index names that is not there, an embedding of another shape
than config.json's. Real safetensors files (safetensors' own writer), read back by header only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save as safetensors_bytes

from tests.core.test_model_check import model_files, write_folder
from tuiapp.core.plan.estimate import TINY_CONFIG
from tuiapp.core.prelaunch.model_check import check_model

VOCAB, HIDDEN = TINY_CONFIG["vocab_size"], TINY_CONFIG["hidden_size"]


def good_weights() -> bytes:
    return safetensors_bytes({"model.embed_tokens.weight": np.zeros((VOCAB, HIDDEN), dtype=np.float32),
                              "lm_head.weight": np.ones((4, 4), dtype=np.float32)})


def folder_with(tmp_path: Path, weights: bytes) -> Path:
    files = model_files()
    files["model.safetensors"] = weights
    return write_folder(tmp_path / "m", files)


def error_of(folder: Path) -> str:
    [finding] = check_model(str(folder), offline=True)
    assert (finding.level, finding.key) == ("error", "model.name") and finding.fix
    return finding.message


def test_readable_weights_pass(tmp_path):
    assert check_model(str(folder_with(tmp_path, good_weights())), offline=True) == []


@pytest.mark.parametrize("damage, needle", [
    (lambda raw: raw[: len(raw) - 100], "truncated"),
    (lambda raw: os.urandom(len(raw)), "not a readable safetensors file"),
    (lambda raw: b"", "empty"),
    (lambda raw: raw[:5], "too short"),
    (lambda raw: raw + b"\0" * 64, "more than its tensors"),
])
def test_damaged_safetensors_are_refused_naming_the_file(tmp_path, damage, needle):
    folder = folder_with(tmp_path, damage(good_weights()))
    message = error_of(folder)
    assert needle in message and str(folder / "model.safetensors") in message


def test_a_header_that_is_not_json_is_refused(tmp_path):
    header = b"{not json at all"
    message = error_of(folder_with(tmp_path, len(header).to_bytes(8, "little") + header))
    assert "header does not parse" in message


def test_an_embedding_of_another_model_is_refused(tmp_path):
    other = safetensors_bytes({"model.embed_tokens.weight": np.zeros((VOCAB + 1, HIDDEN), dtype=np.float32)})
    assert "config.json says vocab_size" in error_of(folder_with(tmp_path, other))


def test_a_missing_shard_named_by_the_index_is_refused(tmp_path):
    files = model_files(weights=False)
    files["model.safetensors.index.json"] = json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}).encode()
    files["model-00001-of-00002.safetensors"] = good_weights()
    assert "model-00002-of-00002.safetensors, which is not there" in error_of(write_folder(tmp_path / "m", files))


def test_empty_bin_is_refused(tmp_path):
    files = model_files(weights=False)
    files["pytorch_model.bin"] = b""
    assert "pytorch_model.bin is empty" in error_of(write_folder(tmp_path / "m", files))


def test_llmtui_validate_refuses_a_truncated_model_naming_the_file(tmp_path):
    folder = folder_with(tmp_path, good_weights()[:-100])
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[model]\nname = "{folder}"\n[method]\nkind = "lora"\n')
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(tmp_path / "runs"), "validate",
                             str(recipe)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    out = result.stdout + result.stderr
    assert result.returncode == 2 and "truncated" in out and str(folder / "model.safetensors") in out, out
    assert "Traceback" not in out
