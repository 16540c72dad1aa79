"""Following a growing text log by byte offset (stdout.log, ranks/*.log).

Only new bytes are read; a partial last line waits for its newline; a truncated or replaced
file starts again from its end. The first read returns only the last `initial_bytes`, so a
gigabyte log opens instantly.
"""

from __future__ import annotations

import os
from pathlib import Path

from tuiapp.core.run_folder.rundir import RunDir

MAX_READ = 4 << 20  # at most this much per read: a burst of output cannot stall the worker


class TextTail:
    def __init__(self, path: str | Path, initial_bytes: int = 64 * 1024):
        self.path = Path(path)
        self.offset: int | None = None
        self.initial_bytes = initial_bytes
        self._partial = b""
        self._inode: int | None = None

    def read_new(self) -> tuple[list[str], bool]:
        """(new complete lines, reset): reset is True when the reader started (again) and the
        caller should clear what it shows."""
        try:
            stat = self.path.stat()
        except OSError:
            return [], False
        reset = False
        if self.offset is None or (self._inode is not None and stat.st_ino != self._inode) or stat.st_size < self.offset:
            self.offset = max(0, stat.st_size - self.initial_bytes)
            self._partial = b""
            reset = True
            skip_first = self.offset > 0
        else:
            skip_first = False
        self._inode = stat.st_ino
        if stat.st_size == self.offset:
            return [], reset
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read(min(stat.st_size - self.offset, MAX_READ))
        except OSError:
            return [], reset
        self.offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        if skip_first and lines:
            lines = lines[1:]  # started mid-file: the first line is a fragment
        text = [line.decode("utf-8", errors="replace").rstrip("\r") for line in lines]
        # progress bars rewrite one line with \r: show the last state of each line
        return [t.rsplit("\r", 1)[-1] for t in text], reset


def log_sources(run_path: Path) -> list[tuple[str, Path]]:
    """(label, path) of every log of a run: stdout.log first, then ranks/*.log and stack dumps, and
    nodes/*.log (if present)."""
    sources = [("stdout", RunDir(run_path).stdout_log)]
    ranks = RunDir(run_path).ranks
    try:
        # rank logs and stack dumps; not the ranks' phase and memory records (JSON)
        names = sorted(e.name for e in os.scandir(ranks) if e.is_file() and e.name.endswith((".log", ".txt")))
    except OSError:
        names = []
    for name in names:
        sources.append((f"ranks/{name}", ranks / name))
    nodes = RunDir(run_path).nodes
    try:
        node_logs = sorted(e.name for e in os.scandir(nodes) if e.name.endswith(".log"))
    except OSError:
        node_logs = []
    for name in node_logs:
        sources.append((f"nodes/{name}", nodes / name))
    supervisor = RunDir(run_path).supervisor_log
    if supervisor.exists():
        sources.append(("supervisor", supervisor))
    return sources


def tail_lines(path: Path, count: int = 20, max_bytes: int = 65536) -> list[str]:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read()
    except OSError:
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-count:]
