"""A folder of JSON records, one file per event named by its UTC time (runs/<id>/evals/,
runs/<id>/exports/): a new name never overwrites, writes are atomic (a reader never sees half a
file), and a listing is oldest first and skips what cannot be read."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path


def new_path(folder: Path, now: float | None = None) -> Path:
    """Where the next record goes (never an existing file)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
    path, n = Path(folder) / f"{stamp}.json", 1
    while path.exists():
        n += 1
        path = Path(folder) / f"{stamp}_{n:03d}.json"  # sorts after {stamp}.json ('_' > '.')
    return path


def write(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=2, ensure_ascii=False, default=str), encoding="utf-8")
    os.replace(tmp, path)


def read(path: Path) -> dict | None:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def listing(folder: Path, valid: Callable[[dict], bool]) -> list[tuple[Path, dict]]:
    """(path, record) of every readable, valid record, oldest first."""
    try:
        names = sorted(p for p in os.listdir(folder) if p.endswith(".json") and not p.startswith("."))
    except OSError:
        return []
    found = [(Path(folder) / name, read(Path(folder) / name)) for name in names]
    return [(path, data) for path, data in found if data is not None and valid(data)]
