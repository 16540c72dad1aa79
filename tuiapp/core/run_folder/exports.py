"""Exports of a run: runs/<id>/exports/<UTC time>.json, one record per `llmtui export` (or the
TUI's Export), written once the export is done, so the TUI shows a run's exports live, whoever made
them. A record:

    {"time": 1763769600.0, "out": "/abs/folder", "merged": true, "dtype": "bfloat16",
     "gguf": "q8_0", "push": null, "ollama": null, "files": 7}
"""

from __future__ import annotations

import time
from pathlib import Path

from tuiapp.core.run_folder import rundir, stamped
from tuiapp.core.run_folder.rundir import RunDir

EXPORTS = rundir.EXPORTS_DIR


def record(run_dir: Path, entry: dict, now: float | None = None) -> Path:
    """Write one export's record (atomically: a reader never sees half a file); its path."""
    now = time.time() if now is None else now
    path = stamped.new_path(RunDir(run_dir).exports, now)
    stamped.write(path, {"time": now, **entry})
    return path


def made(run_dir: Path) -> list[dict]:
    """Every readable export record of a run, oldest first."""
    return [data for _, data in stamped.listing(RunDir(run_dir).exports, lambda data: bool(data.get("out")))]


def describe(entry: dict) -> str:
    """'/abs/folder (merged, bfloat16, GGUF q8_0, pushed to o/n)': what an export wrote."""
    parts = ["merged" if entry.get("merged") else "adapter or model as trained"]
    parts += [str(entry["dtype"])] if entry.get("dtype") else []
    parts += [f"GGUF {entry['gguf']}"] if entry.get("gguf") else []
    parts += [f"pushed to {entry['push']}"] if entry.get("push") else []
    parts += [f"ollama {entry['ollama']}"] if entry.get("ollama") else []
    return f"{entry.get('out')} ({', '.join(parts)})"
