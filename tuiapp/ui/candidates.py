"""What the new-experiment form offers to pick: base models and datasets found on this machine."""

from __future__ import annotations

import os
from pathlib import Path

from tuiapp.core.recipe import BUNDLED_MODEL
from tuiapp.core.runs import RunStore

DEMO_DATASETS = ["demo:facts", "demo:chat", "demo:text"]
DATA_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet", ".txt")


def cached_hub_models(cache_dirs: list[Path]) -> list[str]:
    """Hub ids downloaded into the HF cache (folders models--owner--name with a snapshot)."""
    found = []
    for cache in cache_dirs:
        try:
            entries = list(os.scandir(cache))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir() and entry.name.startswith("models--") and (Path(entry.path) / "snapshots").is_dir():
                found.append(entry.name[len("models--"):].replace("--", "/"))
    return sorted(set(found))


def run_models(store: RunStore) -> list[str]:
    """`run:NAME` for every name with a succeeded run that has a final model."""
    names = []
    for run in store.list(refresh=False):
        if run.status == "succeeded" and run.final_path.is_dir():
            names.append(f"run:{run.name}")
    return sorted(set(names))


def model_candidates(store: RunStore, cache_dirs: list[Path]) -> list[str]:
    return [BUNDLED_MODEL, *run_models(store), *cached_hub_models(cache_dirs)]


def local_datasets(base_dir: Path, limit: int = 50) -> list[str]:
    """Data files in ./data (relative to base_dir), for the dataset picker."""
    out = []
    folder = base_dir / "data"
    try:
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if entry.is_file() and entry.name.lower().endswith(DATA_SUFFIXES):
                out.append(f"data/{entry.name}")
                if len(out) >= limit:
                    break
    except OSError:
        pass
    return out
