"""Checkpoints that are complete or absent: written to a staging folder, then renamed."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from tuiapp.core.run_folder.rundir import CHECKPOINT_STATE_JSON

STAGING = ".staging"
PATTERN = re.compile(r"^checkpoint-(\d+)$")


def complete_checkpoints(root: Path) -> list[Path]:
    """Finished checkpoints, oldest first. A checkpoint must hold its trainer state."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = PATTERN.match(child.name)
        if match and child.is_dir() and (child / CHECKPOINT_STATE_JSON).is_file():
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def last_checkpoint(root: Path) -> Path | None:
    done = complete_checkpoints(root)
    return done[-1] if done else None


def checkpoint_step(path: Path) -> int:
    return int(PATTERN.match(path.name).group(1))


def publish(staging_root: Path, name: str, root: Path, keep: int) -> Path:
    """Move a staged checkpoint into place atomically and keep only the newest `keep`."""
    target = root / name
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging_root / name, target)
    try:
        staging_root.rmdir()
    except OSError:
        pass  # not empty: another staged save is under way
    for old in complete_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def clear_staging(root: Path) -> None:
    shutil.rmtree(root / STAGING, ignore_errors=True)
