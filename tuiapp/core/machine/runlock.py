"""One supervisor per run folder: an flock held from the moment a start is decided until the
supervisor exits.

The starting process takes the lock, then hands its descriptor to the supervisor it spawns, so
the lock is never free in between; the kernel releases it when the supervisor dies, however it
dies. A lock that is free means no supervisor lives, whatever run.json says. Where the lock lies in a
run folder: tuiapp.core.run_folder.rundir.lock_path.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path


def acquire(path: Path, wait_s: float = 2.0) -> int | None:
    """The locked descriptor, or None when another process holds the lock. Waits a little, so
    a reader's brief check (held()) never makes a start fail."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.05)


def held(path: Path) -> bool | None:
    """True while a supervisor holds the lock; False when free; None when the run has no lock
    file (made before locks existed, or never started)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the shared lock we may have taken
    return False
