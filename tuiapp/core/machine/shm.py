"""Shared memory a run leaves behind: DeepSpeed's CPU comm op creates one all-reduce buffer per
rank in /dev/shm (`deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>`, ~66 MB each) and never
unlinks it. Each run has its own master port, so nothing reuses them: they fill RAM until reboot
unless the run's supervisor removes its own after its ranks are gone."""

from __future__ import annotations

import os
from pathlib import Path

SHM_DIR = Path("/dev/shm")


def buffers(port: int | str | None, shm_dir: Path = SHM_DIR) -> list[Path]:
    """This user's DeepSpeed all-reduce buffers for one master port."""
    if not port or not shm_dir.is_dir():
        return []
    return sorted(shm_dir.glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*_{int(port)}_*"))


def reclaim(port: int | str | None, shm_dir: Path = SHM_DIR) -> int:
    """Remove a finished run's buffers; the bytes freed. Call only once its ranks are gone."""
    freed = 0
    for path in buffers(port, shm_dir):
        try:
            freed += path.stat().st_size
            path.unlink()
        except OSError:
            pass
    return freed
