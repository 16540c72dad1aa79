"""Tokenized datasets on disk: built once, by one rank, in parallel, and shared.

An entry is cache_dir/data/<key>/ (key: a hash of the data, tokenizer, template and settings; see
tuiapp.trainer.dataset.data.cache_key): Arrow files, memory-mapped when loaded, and llmtui.json (what it
holds, when it was built and last used; `llmtui cache list|prune` read it). A build's Arrow files
are moved into the entry, never copied: a copy reads every row through a memory map, and the
building rank's resident memory grew with the corpus (4.3 GB of mapped pages for a 1 GB corpus). Ranks and runs
that need the same key share it: the first takes the entry's lock (flock) and builds it; the others
wait on the lock, then load it. While it builds, the rank's phase record carries the progress
(documents done of the total, documents and MB per second, ETA) for `llmtui run` and the TUI.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from tuiapp.core.data import cache_entry
from tuiapp.core.run_folder import events as ev
from tuiapp.core.run_folder import rundir
from tuiapp.core.run_folder.metrics import JsonlWriter
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.trainer import phases

log = logging.getLogger("llmtui.data")
ENTRY_INFO = cache_entry.ENTRY_INFO
PROGRESS_EVERY_S = 2.0  # how often the phase record's progress is rewritten
PARALLEL_FROM = 20_000  # documents: fewer are tokenized in the rank itself (workers cost a second to start)
MAX_WORKERS = 8


def workers(documents: int) -> int:
    """Tokenizing processes for this many documents: LLMTUI_TOKENIZE_WORKERS, else every core (at
    most MAX_WORKERS) for a large corpus and none (in the rank itself) for a small one."""
    forced = os.environ.get("LLMTUI_TOKENIZE_WORKERS")
    if forced:
        return max(1, int(forced))
    if documents < PARALLEL_FROM:
        return 1
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1))


def shared_entry(folder: Path, build):
    """The entry at `folder`, built by `build(scratch) -> (dataset, info)` once across ranks and runs
    (under the entry's lock; `scratch`: a folder for its intermediate Arrow files, removed once the
    entry is saved), then loaded (memory-mapped). An entry that fails its check (its files against the
    sizes and checksums recorded at write, then Arrow's own reading) is reported with its path and
    rebuilt."""
    if folder.is_dir():
        loaded = _load_checked(folder)
        if loaded is not None:
            touch(folder)
            log.info("tokenized dataset loaded from cache %s", folder)
            return loaded
    folder.parent.mkdir(parents=True, exist_ok=True)
    locks = folder.parent.parent / "locks"  # beside the entries: `data/` holds entries only
    locks.mkdir(exist_ok=True)
    with _locked(locks / f"{folder.parent.name}-{folder.name}.lock"):
        if folder.is_dir():  # another rank or run may have built (or rebuilt) it while this one waited
            loaded = _load_checked(folder)
            if loaded is not None:
                touch(folder)
                log.info("tokenized dataset loaded from cache %s (built while this rank waited)", folder)
                return loaded
            _discard(folder)
        scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}-scratch-", dir=folder.parent))
        try:
            dataset, info = build(scratch)
            save_atomically(dataset, folder, info, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            release_freed_memory()  # before the training stacks its memory on what the build freed
    return load_entry(folder)


def _load_checked(folder: Path):
    """The entry loaded, or None when it is damaged (reported: the rank's log and the run's events)."""
    why = cache_entry.problem(folder)
    if why is None:
        try:
            return load_entry(folder)
        except Exception as exc:  # noqa: BLE001 - Arrow's errors (ArrowInvalid, OSError...) all mean damaged
            why = f"{folder} cannot be read ({type(exc).__name__}: {str(exc)[:300]})"
    message = f"tokenized cache entry {folder} is damaged: {why}; it is rebuilt"
    log.warning(message)
    print(f"warning: {message}", flush=True)
    run_dir, rank = phases._state["run_dir"], phases._state["rank"]
    if run_dir is not None and not rank:
        with contextlib.suppress(OSError), JsonlWriter(RunDir(run_dir).events) as events:
            events.write({"event": ev.CACHE_DAMAGED, "path": str(folder), "reason": why, "action": "rebuilt"})
    return None


def _discard(folder: Path) -> None:
    """Move a damaged entry out of the way (under its lock), then remove it."""
    gone = folder.parent / f".{folder.name}-damaged-{os.getpid()}"
    with contextlib.suppress(OSError):
        os.rename(folder, gone)
    shutil.rmtree(gone, ignore_errors=True)


def release_freed_memory() -> None:
    """Return the pages a build freed to the system. Arrow's allocator (mimalloc) keeps them (~50 MB
    after cutting the blocks of 256 MB of text), and the training that follows in the same process
    stacked its memory on top: a cold rank peaked ~130 MB above a warm one."""
    import ctypes

    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    with contextlib.suppress(OSError, AttributeError):  # glibc only
        ctypes.CDLL("libc.so.6").malloc_trim(0)


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive flock; a rank waiting for it reports so in its phase record every few seconds
    (the hang watchdog sees it alive)."""
    with open(path, "a+") as handle:
        waited = 0.0
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if waited % PROGRESS_EVERY_S < 0.25:
                    report({"waiting": "another rank or run is tokenizing this data"})
                time.sleep(0.25)
                waited += 0.25
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def save_atomically(dataset, folder: Path, info: dict, scratch: Path | None = None) -> None:
    """Fill a temporary folder, then rename it: a reader sees all of it or nothing. A dataset that is
    exactly the Arrow files of `scratch` has them moved in (listed in llmtui.json as `files`); any
    other (small, in memory) is saved with datasets' save_to_disk."""
    building = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        files = _own_files(dataset, scratch)
        if files:
            names = [f"data-{index:05d}.arrow" for index in range(len(files))]
            for path, name in zip(files, names, strict=True):
                os.rename(path, building / name)  # same file system: scratch lies beside the entry
            info = {**info, "files": names}
        else:
            dataset.save_to_disk(str(building))
        now = time.time()
        info = {**info, "rows": len(dataset), "built": now, "used": now,
                "manifest": cache_entry.manifest(building)}  # each file's size and sha256: checked on load
        (building / ENTRY_INFO).write_text(json.dumps(info))
        try:
            os.rename(building, folder)
        except OSError:
            if not folder.is_dir():
                raise  # a real error, not another process that finished first
    finally:
        shutil.rmtree(building, ignore_errors=True)


def _own_files(dataset, scratch: Path | None) -> list[Path]:
    """The Arrow files in `scratch` that hold exactly `dataset`, in order; [] when it is anything else
    (in memory, a selection of rows, or files outside scratch)."""
    if scratch is None or getattr(dataset, "_indices", None) is not None:
        return []
    files = [Path(entry["filename"]) for entry in dataset.cache_files]
    if not files or any(path.parent != scratch and scratch not in path.parents for path in files):
        return []
    from datasets.table import MemoryMappedTable

    tables = [MemoryMappedTable.from_file(str(path)) for path in files]  # their schemas and row counts only
    if (sum(table.num_rows for table in tables) != len(dataset)
            or any(table.column_names != dataset.column_names for table in tables)):
        return []  # rows or columns chosen without a rewrite (select, rename): the files hold more
    return files


def load_entry(folder: Path):
    """An entry as one memory-mapped dataset: its moved Arrow files, or a save_to_disk folder."""
    from datasets import Dataset, concatenate_datasets, load_from_disk

    names = entry_info(folder).get("files")
    if not names:
        return load_from_disk(str(folder))
    parts = [Dataset.from_file(str(folder / name)) for name in names]
    return parts[0] if len(parts) == 1 else concatenate_datasets(parts)


def touch(folder: Path) -> None:
    """Record that a run used the entry (prune keeps recently used ones)."""
    path = folder / ENTRY_INFO
    try:
        info = json.loads(path.read_text())
        info["used"] = time.time()
        tmp = path.with_name(f".{ENTRY_INFO}.{os.getpid()}")
        tmp.write_text(json.dumps(info))
        os.replace(tmp, path)
    except (OSError, ValueError):
        pass  # an entry from before llmtui.json, or a read-only cache: nothing to record


def report(progress: dict) -> None:
    """This rank's phase record (ranks/phase-<rank>.json) gets `progress`."""
    run_dir, phase = phases._state["run_dir"], phases.current()
    if run_dir is None or phase is None:
        return
    try:
        rundir.write_phase(run_dir, phases._state["rank"], phase, progress=progress)
    except OSError:
        pass  # a full disk must not end the run; the figure just lags


class Progress(threading.Thread):
    """Watches the `tokenizing` progress bar that datasets' map keeps in this process (its count
    arrives from the worker processes) and reports documents done of the total, documents and MB
    per second and the ETA, every PROGRESS_EVERY_S."""

    def __init__(self, documents: int, source_bytes: int, workers: int):
        super().__init__(daemon=True, name="tokenize-progress")
        self.documents, self.source_bytes, self.workers = documents, source_bytes, workers
        self.started = time.monotonic()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(PROGRESS_EVERY_S):
            count = _bar_count("tokenizing")
            if count is not None:
                report(self.figure(count))

    def figure(self, count: int) -> dict:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        share = count / self.documents if self.documents else 0.0
        rate = count / elapsed
        return {"done": count, "total": self.documents, "docs_per_s": round(rate, 1),
                "mb_per_s": round(self.source_bytes * share / elapsed / 1e6, 2), "workers": self.workers,
                "eta_s": round((self.documents - count) / rate, 1) if rate > 0 else None}

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.join(timeout=5)


def _bar_count(desc: str) -> int | None:
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", [])):
        if str(getattr(bar, "desc", "")).startswith(desc):
            return int(bar.n)
    return None


def entry_info(folder: Path) -> dict:
    try:
        return json.loads((folder / ENTRY_INFO).read_text())
    except (OSError, ValueError):
        return {}
