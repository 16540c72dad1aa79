"""metrics.jsonl in columns: a snapshot file of arrays of doubles and a JSON header.

Two kinds of file use this format. The trainer keeps `runs/<id>/metrics.columns` current as it
writes metrics.jsonl (rundata.MetricsWriter); the TUI keeps `runs/.cache/columns/<id>.bin` for
runs that have none (an older llmtui made them). A snapshot covers metrics.jsonl up to a byte
offset; a reader loads it in milliseconds and parses only the lines written after that offset.

A snapshot holds while metrics.jsonl is the same file (inode), still has at least the bytes it
covers, and the bytes just before that offset are the ones it was made from; it is replaced
whole (temp file + os.replace), so a reader never sees half of one. A file that fails any check
(torn, truncated, another version, another machine's byte order) is ignored: the reader then
parses metrics.jsonl itself.
"""

from __future__ import annotations

import os
import sys
from array import array
from pathlib import Path

import orjson

from tuiapp.core.run_folder import rundir

VERSION = 2  # 2: the RL series
COLUMNS_NAME = rundir.METRICS_COLUMNS  # the trainer's, in the run folder
_TAIL = 64  # bytes before the covered offset that must still be there for a snapshot to hold
_MAX_HEADER = 64 << 20


def columns_path(run_dir: Path) -> Path:
    """The columns the trainer keeps beside the run's metrics.jsonl."""
    return rundir.RunDir(run_dir).metrics_columns


def columns_cache(run_dir: Path) -> Path:
    """Where the TUI keeps columns of a run that has none of its own: runs/.cache/columns/<id>.bin
    (a dot folder: never taken for a run)."""
    return run_dir.parent / ".cache" / "columns" / f"{run_dir.name}.bin"


def save(path: Path, metrics_path: Path, covered: int, header: dict, arrays: list[tuple[str, array]]) -> bool:
    """Write a snapshot of `arrays` covering metrics.jsonl up to byte `covered`; False when it
    could not be written (a read-only folder, a full disk, values JSON cannot hold)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        stat = metrics_path.stat()
        with open(metrics_path, "rb") as handle:
            handle.seek(max(0, covered - _TAIL))
            tail = handle.read(min(covered, _TAIL))
        head = orjson.dumps({
            **header, "version": VERSION, "byteorder": sys.byteorder, "inode": stat.st_ino, "covered": covered,
            "tail": tail.hex(), "arrays": [[name, len(values)] for name, values in arrays],
        }, option=orjson.OPT_SERIALIZE_NUMPY)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as handle:
            handle.write(len(head).to_bytes(8, "little"))
            handle.write(head)
            for _, values in arrays:
                values.tofile(handle)
        os.replace(tmp, path)
        return True
    except (OSError, TypeError, ValueError):
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        return False


def load(path: Path, metrics_path: Path) -> tuple[dict, dict[str, array], int] | None:
    """(header, arrays by name, metrics.jsonl's inode) of a snapshot that holds for
    metrics.jsonl as it is now; None when there is none or it does not hold."""
    try:
        raw = path.read_bytes()
        size = int.from_bytes(raw[:8], "little")
        if len(raw) < 8 or size > min(len(raw) - 8, _MAX_HEADER):
            return None  # torn or not a snapshot
        header = orjson.loads(raw[8 : 8 + size])
        counts = [(name, int(count)) for name, count in header["arrays"]]
        if len(raw) != 8 + size + 8 * sum(count for _, count in counts):
            return None  # torn: fewer (or more) bytes than the header lists
        if header.get("version") != VERSION or header.get("byteorder") != sys.byteorder:
            return None
        stat = metrics_path.stat()
        covered = header["covered"]
        if header["inode"] != stat.st_ino or not 0 <= covered <= stat.st_size:
            return None
        with open(metrics_path, "rb") as handle:
            handle.seek(max(0, covered - _TAIL))
            if handle.read(min(covered, _TAIL)).hex() != header["tail"]:
                return None
        columns: dict[str, array] = {}
        offset = 8 + size
        view = memoryview(raw)  # slices without copies: each column is copied once, into its array
        for name, count in counts:
            values = array("d")
            values.frombytes(view[offset : offset + count * 8])
            offset += count * 8
            columns[name] = values
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    return header, columns, stat.st_ino


def holds(path: Path, metrics_path: Path) -> bool:
    """Whether a snapshot at `path` holds for metrics.jsonl as it is now: `load`'s checks from
    its header alone (the file's size, not its arrays), so that asking is cheap."""
    try:
        with open(path, "rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            if not 0 < size <= _MAX_HEADER:
                return False
            header = orjson.loads(handle.read(size))
        counts = [int(count) for _, count in header["arrays"]]
        if path.stat().st_size != 8 + size + 8 * sum(counts):
            return False
        if header.get("version") != VERSION or header.get("byteorder") != sys.byteorder:
            return False
        stat = metrics_path.stat()
        covered = header["covered"]
        if header["inode"] != stat.st_ino or not 0 <= covered <= stat.st_size:
            return False
        with open(metrics_path, "rb") as handle:
            handle.seek(max(0, covered - _TAIL))
            return handle.read(min(covered, _TAIL)).hex() == header["tail"]
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return False
