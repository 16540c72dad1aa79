"""A folder that llmtui makes itself (the tiny models, the zoo, demo:shapes), built once and shared:
made in a hidden temporary folder beside its place, then renamed into it, so readers see all of it
or nothing and several processes (ranks, tests) may ask for it at once."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    """llmtui's cache: $LLMTUI_CACHE, else ~/.cache/llmtui (tiny models, demo data, tokenized
    datasets, model profiles, DeepSpeed's ops, llama.cpp's converter)."""
    return Path(os.environ.get("LLMTUI_CACHE") or "~/.cache/llmtui").expanduser()


def build_once(target: Path, build: Callable[[Path], None], complete: Callable[[Path], bool]) -> Path:
    """`target`, made by `build(folder)` unless `complete(target)` says it is there already."""
    if complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{target.name}-building-", dir=target.parent))
    try:
        build(building)
        if target.exists() and not complete(target):
            shutil.rmtree(target, ignore_errors=True)  # left by a foreign hand; rebuild it
        try:
            os.rename(building, target)  # atomic: readers see all of it or nothing
        except OSError:
            if not complete(target):  # another process won the race, unless this is a real error
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target
