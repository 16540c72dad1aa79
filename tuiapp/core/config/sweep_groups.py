"""Sweeps' records on disk (runs/.groups/<id>.json), read without the recipe schema: the
history lists them while it starts, and importing core.config.sweep (pydantic's recipe) there cost
~0.3 s of its first summaries on a loaded machine."""

from __future__ import annotations

import json
from pathlib import Path

GROUPS_DIR = ".groups"


def groups_dir(runs_root: Path) -> Path:
    return Path(runs_root) / GROUPS_DIR


def list_groups(runs_root: Path) -> dict[str, dict]:
    """Every sweep's record in runs/.groups/, by id (unreadable files are skipped)."""
    out: dict[str, dict] = {}
    for path in sorted(groups_dir(runs_root).glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("id"):
            out[str(record["id"])] = record
    return out
