"""What the app is opened on, and the knobs tests and benchmarks inject (clock, polling)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


@dataclass
class UiConfig:
    """Everything the screens need from outside. Tests pass a fixed clock and no monitors, so
    snapshots never show the wall clock or this machine's GPUs."""

    runs_root: Path
    base_dir: Path = field(default_factory=Path.cwd)  # recipes/ and relative dataset paths
    clock: Callable[[], float] = time.time
    poll_s: float = 0.25  # how often live files are tailed
    history_poll_s: float = 2.0  # how often the runs folder is rescanned
    batch_size: int = 200  # run.json files per RunsLoaded message (doubling up to 16x)
    first_batch: int = 50  # run.json files read before the first frame (a screenful); the worker reads the rest
    system_monitor: bool = True  # NVML / psutil sampling in the run view
    hf_cache_dirs: list[Path] | None = None  # None = the usual HF cache folders
    live: bool = True  # False: read once, never poll (snapshots)

    @property
    def recipes_dir(self) -> Path:
        return self.base_dir / "recipes"

    def cache_dirs(self) -> list[Path]:
        if self.hf_cache_dirs is not None:
            return list(self.hf_cache_dirs)
        import os

        dirs = []
        for var, sub in (("HF_HUB_CACHE", ""), ("HF_HOME", "hub")):
            if os.environ.get(var):
                dirs.append(Path(os.environ[var]) / sub if sub else Path(os.environ[var]))
        dirs.append(Path.home() / ".cache" / "huggingface" / "hub")
        return dirs
