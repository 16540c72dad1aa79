"""Exports of a run: runs/<id>/exports/<UTC time>.json, one record per `llmtui export` (or the
TUI's Export), written once the export is done, so the TUI shows a run's exports live, whoever made
them. A record:

    {"time": 1763769600.0, "out": "/abs/folder", "merged": true, "dtype": "bfloat16",
     "gguf": "q8_0", "push": null, "ollama": null, "files": 7}
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

EXPORTS = "exports"


def record(run_dir: Path, entry: dict, now: float | None = None) -> Path:
    """Write one export's record (atomically: a reader never sees half a file); its path."""
    now = time.time() if now is None else now
    folder = Path(run_dir) / EXPORTS
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    path, n = folder / f"{stamp}.json", 1
    while path.exists():
        n += 1
        path = folder / f"{stamp}_{n:03d}.json"
    tmp = folder / f".{path.name}.tmp"
    tmp.write_text(json.dumps({"time": now, **entry}, indent=2, ensure_ascii=False, default=str), encoding="utf-8")
    os.replace(tmp, path)
    return path


def made(run_dir: Path) -> list[dict]:
    """Every readable export record of a run, oldest first."""
    folder = Path(run_dir) / EXPORTS
    try:
        names = sorted(p for p in os.listdir(folder) if p.endswith(".json") and not p.startswith("."))
    except OSError:
        return []
    out = []
    for name in names:
        try:
            data = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("out"):
            out.append(data)
    return out


def describe(entry: dict) -> str:
    """'/abs/folder (merged, bfloat16, GGUF q8_0, pushed to o/n)': what an export wrote."""
    parts = ["merged" if entry.get("merged") else "adapter or model as trained"]
    parts += [str(entry["dtype"])] if entry.get("dtype") else []
    parts += [f"GGUF {entry['gguf']}"] if entry.get("gguf") else []
    parts += [f"pushed to {entry['push']}"] if entry.get("push") else []
    parts += [f"ollama {entry['ollama']}"] if entry.get("ollama") else []
    return f"{entry.get('out')} ({', '.join(parts)})"
