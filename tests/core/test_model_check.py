"""The base model check: local folders, adapter folders, the HF cache and the hub, in seconds.

The HF cache here is a real one: blobs, snapshot symlinks and refs/main written with
huggingface_hub's own helpers, and read back by its scan_cache_dir before any check uses it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import scan_cache_dir
from huggingface_hub.file_download import (
    _cache_commit_hash_for_specific_revision,
    _create_symlink,
    _get_pointer_path,
    repo_folder_name,
)
from safetensors.numpy import save as safetensors_bytes
from tokenizers import Tokenizer, models

from tuiapp.core.config.recipe import recipe_from_dict
from tuiapp.core.plan.estimate import TINY_CONFIG, load_model_config
from tuiapp.core.prelaunch import door, model_check
from tuiapp.core.prelaunch.model_check import check_model
from tuiapp.core.store.runs import RunStore

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


CHAT = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"


def model_files(*, config=True, weights=True, tokenizer=True) -> dict[str, bytes]:
    """What save_pretrained writes for a (very small) model: config, safetensors, tokenizer."""
    files = {}
    if config:
        files["config.json"] = json.dumps(TINY_CONFIG).encode()
    if weights:
        files["model.safetensors"] = safetensors_bytes({"lm_head.weight": np.zeros((4, 4), dtype=np.float32)})
    if tokenizer:
        files["tokenizer.json"] = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>")).to_str().encode()
        # a chat model's tokenizer: a chat template (a base model without one needs dataset.template)
        files["tokenizer_config.json"] = json.dumps({"eos_token": "<unk>", "chat_template": CHAT}).encode()
    return files


def write_folder(folder: Path, files: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def cache_repo(cache: Path, repo_id: str, files: dict[str, bytes]) -> Path:
    """Put `files` into the HF cache at `cache` as `hf download` does; returns the snapshot."""
    storage = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    for name, data in files.items():
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        pointer = Path(_get_pointer_path(str(storage), COMMIT, name))
        pointer.parent.mkdir(parents=True, exist_ok=True)
        _create_symlink(str(blob), str(pointer))
    _cache_commit_hash_for_specific_revision(str(storage), "main", COMMIT)
    seen = {repo.repo_id: repo for repo in scan_cache_dir(cache).repos}
    assert {f.file_name for f in seen[repo_id].refs["main"].files} == set(files)  # the library agrees
    return storage / "snapshots" / COMMIT


def messages(findings, level="error"):
    return [f.message for f in findings if f.level == level]


# ---------------------------------------------------------------- local folders


def test_bundled_model_always_passes(tmp_path):
    assert check_model("tiny", cache_dir=tmp_path, offline=True) == []


def test_complete_local_folder_passes_and_relative_paths_start_at_base_dir(tmp_path):
    write_folder(tmp_path / "models" / "m", model_files())
    assert check_model(str(tmp_path / "models" / "m"), offline=True) == []
    assert check_model("models/m", base_dir=tmp_path, offline=True) == []


@pytest.mark.parametrize("missing, needle", [
    ("config", "config.json"), ("weights", "weights"), ("tokenizer", "tokenizer"),
])
def test_incomplete_local_folder_names_what_is_missing(tmp_path, missing, needle):
    folder = write_folder(tmp_path / "m", model_files(**{missing: False}))
    [finding] = check_model(str(folder), offline=True)
    assert (finding.level, finding.key) == ("error", "model.name")
    assert needle in finding.message and str(folder) in finding.message
    assert finding.fix


def test_pretraining_needs_no_weights(tmp_path):
    folder = write_folder(tmp_path / "m", model_files(weights=False))
    assert check_model(str(folder), method_kind="pretrain", offline=True) == []
    assert messages(check_model(str(folder), method_kind="lora", offline=True))


def test_sharded_weights_count_by_their_index(tmp_path):
    files = model_files(weights=False)
    files["model.safetensors.index.json"] = json.dumps({"weight_map": {}}).encode()
    assert check_model(str(write_folder(tmp_path / "m", files)), offline=True) == []


def test_missing_path_is_an_error_not_a_hub_lookup(tmp_path):
    start = time.monotonic()
    [finding] = check_model("./no-such-model", base_dir=tmp_path, offline=False)
    assert finding.key == "model.name" and "no such folder" in finding.message
    assert time.monotonic() - start < 2


# ---------------------------------------------------------------- adapter folders (an earlier run's final/)


def adapter_folder(folder: Path, base: str, *, weights=True, method="lora") -> Path:
    files = {k: v for k, v in model_files(config=False, weights=False).items()}
    files["adapter_config.json"] = json.dumps({"peft_type": "LORA", "base_model_name_or_path": base}).encode()
    if weights:
        files["adapter_model.safetensors"] = safetensors_bytes({"a": np.zeros((2, 2), dtype=np.float32)})
    files["llmtui.json"] = json.dumps({"method": method, "base_model": base}).encode()
    return write_folder(folder, files)


def test_adapter_folder_and_its_base(tmp_path):
    base = write_folder(tmp_path / "base", model_files())
    assert check_model(str(adapter_folder(tmp_path / "a1", str(base))), offline=True) == []
    # the adapter's weights are missing
    [finding] = check_model(str(adapter_folder(tmp_path / "a2", str(base), weights=False)), offline=True)
    assert "adapter_model.safetensors" in finding.message
    # its base model is gone: the base is named
    [finding] = check_model(str(adapter_folder(tmp_path / "a3", str(tmp_path / "gone"))), offline=True)
    assert "base model" in finding.message and str(tmp_path / "gone") in finding.message
    # a prompt-learning adapter cannot be merged into its base to train on
    [finding] = check_model(str(adapter_folder(tmp_path / "a4", str(base), method="prefix")), offline=True)
    assert "prefix adapter" in finding.message


def test_bottleneck_adapter_folder_uses_llmtui_json_for_its_base(tmp_path):
    base = write_folder(tmp_path / "base", model_files())
    files = model_files(config=False, weights=False)
    files["bottleneck_config.json"] = b'{"bottleneck_size": 8}'
    files["bottleneck_adapter.pt"] = b"torch pickle"
    files["llmtui.json"] = json.dumps({"method": "adapter", "base_model": str(base)}).encode()
    assert check_model(str(write_folder(tmp_path / "b", files)), offline=True) == []
    (tmp_path / "b" / "llmtui.json").write_text(json.dumps({"method": "adapter", "base_model": str(tmp_path / "x")}))
    assert "base model" in messages(check_model(str(tmp_path / "b"), offline=True))[0]


@pytest.mark.slow  # over ~5 s on 2 cores
def test_run_reference_is_checked_as_its_final_folder(tmp_path):
    store = RunStore(tmp_path / "runs")
    earlier = store.create(recipe_from_dict({"name": "base", "method": {"kind": "lora"}}))
    adapter_folder(earlier.final_path, str(tmp_path / "deleted-base"))
    earlier.update(status="succeeded")
    recipe = recipe_from_dict({"model": {"name": "run:base"}, "method": {"kind": "lora"}})
    findings = door.recipe_findings(recipe, store, tmp_path)
    [finding] = [f for f in findings if f.key == "model.name"]
    assert finding.level == "error" and "run:base" in finding.message and "deleted-base" in finding.message
    write_folder(tmp_path / "deleted-base", model_files())
    assert not [f for f in door.recipe_findings(recipe, store, tmp_path) if f.key == "model.name"]


# ---------------------------------------------------------------- hub ids and the HF cache


def test_cached_hub_model_passes_offline(tmp_path):
    cache_repo(tmp_path / "hub", "acme/small-model", model_files())
    assert check_model("acme/small-model", cache_dir=tmp_path / "hub", offline=True) == []


def test_partly_cached_hub_model_names_what_is_missing(tmp_path):
    cache_repo(tmp_path / "hub", "acme/half-model", model_files(weights=False))  # `hf download X config.json`
    [finding] = check_model("acme/half-model", cache_dir=tmp_path / "hub", offline=True)
    assert "weights" in finding.message and "HF_HUB_OFFLINE" in finding.message


def test_uncached_hub_model_offline_is_an_error_with_the_fix(tmp_path):
    start = time.monotonic()
    [finding] = check_model("acme/not-downloaded", cache_dir=tmp_path / "hub", offline=True)
    assert (finding.level, finding.key) == ("error", "model.name")
    assert "acme/not-downloaded" in finding.message and str(tmp_path / "hub") in finding.message
    assert "hf download acme/not-downloaded" in finding.fix and "HF_HOME" in finding.fix
    assert "local model folder" in finding.fix
    assert time.monotonic() - start < 2


def test_uncached_hub_model_asks_the_hub_briefly(tmp_path):
    # no cache and the hub allowed: the hub is asked with a short timeout. On this machine it cannot
    # be reached; where it can, the repository does not exist. Either way: an error, in seconds.
    start = time.monotonic()
    [finding] = check_model("llmtui-tests/no-such-model-7f3a", cache_dir=tmp_path / "hub", offline=False)
    assert time.monotonic() - start < model_check.HUB_TIMEOUT_S + 3
    assert (finding.level, finding.key) == ("error", "model.name")
    assert "the hub was asked" in finding.message
    assert "hf download llmtui-tests/no-such-model-7f3a" in finding.fix


def test_estimate_reads_the_config_through_the_hf_cache(tmp_path):
    cache_repo(tmp_path / "hub", "Qwen/Qwen2.5-0.5B", {"config.json": json.dumps(dict(TINY_CONFIG, hidden_size=7)).encode()})
    assert load_model_config("Qwen/Qwen2.5-0.5B", cache_dir=tmp_path / "hub")["hidden_size"] == 7  # cache over preset
    assert load_model_config("Qwen/Qwen2.5-0.5B", cache_dir=tmp_path / "empty")["hidden_size"] == 896
    # an adapter folder estimates as its base model
    base = write_folder(tmp_path / "base", model_files())
    assert load_model_config(str(adapter_folder(tmp_path / "a", str(base))))["hidden_size"] == TINY_CONFIG["hidden_size"]


# ---------------------------------------------------------------- the CLI (real processes, real env)


def llmtui(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", **env}
    full.pop("HF_HUB_CACHE", None)
    return subprocess.run([sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(tmp_path / "runs"), *args],
                          cwd=tmp_path, env=full, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.slow  # over ~5 s on 2 cores
def test_validate_and_run_refuse_an_uncached_model_before_creating_anything(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('[model]\nname = "acme/small-model"\n[method]\nkind = "lora"\n')
    for command in (["validate", str(recipe)], ["run", str(recipe)]):
        start = time.monotonic()
        result = llmtui(tmp_path, *command)
        assert time.monotonic() - start < 30
        assert result.returncode == 2, result.stdout + result.stderr
        out = result.stdout + result.stderr
        assert "model.name: acme/small-model" in out and "hf download acme/small-model" in out
        assert "Traceback" not in out and "preflight: ok" not in out
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    # the same model in the HF cache that HF_HOME points at: validate passes
    cache_repo(tmp_path / "hf" / "hub", "acme/small-model", model_files())
    result = llmtui(tmp_path, "validate", str(recipe))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok (lora on acme/small-model" in result.stdout
