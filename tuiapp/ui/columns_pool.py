"""Columns of long runs that have none, made in worker processes.

A run of an older llmtui (or one whose cache was deleted) has only its metrics.jsonl: its first
read parses every line (~2.5 CPU-s per 100,000 rows). Parsed in the UI's process, that holds
the GIL (the screen stops answering) and runs one run after another; here each run's columns
are made by core's rundata.build_columns in a process of its own, as many at once as there are
cores, and the caller hears of each run as it is done (it then reads the columns in ms).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Callable

from tuiapp.core.run_folder.rundata import build_columns


def _start_resource_tracker() -> None:
    """multiprocessing's resource tracker, started with the real stderr: Textual replaces
    sys.stderr while an app runs with an object whose fileno() is -1, which the tracker's start
    would pass on to its process ("bad value(s) in fds_to_keep")."""
    from multiprocessing import resource_tracker

    try:
        sys.stderr.fileno()
        valid = sys.stderr.fileno() >= 0
    except (AttributeError, OSError, ValueError):
        valid = False
    if valid or sys.__stderr__ is None:
        resource_tracker.ensure_running()
        return
    shown, sys.stderr = sys.stderr, sys.__stderr__
    try:
        resource_tracker.ensure_running()
    finally:
        sys.stderr = shown


def _quiet() -> None:
    """A worker process writes nothing to the terminal the TUI draws on (fd 1 and 2 to /dev/null)."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)


def workers_for(count: int) -> int:
    return max(1, min(count, os.cpu_count() or 1))


def build_all(run_dirs: list[Path], on_started: Callable[[Path], None], on_built: Callable[[Path, bool], None],
              cancelled: Callable[[], bool]) -> None:
    """Make the columns of each run in `run_dirs` in worker processes (spawned: the UI's threads
    are not forked). `on_started(path)` when a process takes a run, `on_built(path, ok)` when its
    columns are written (ok False: the caller parses it itself); called on the calling thread.
    Stops handing out runs once `cancelled()`."""
    if not run_dirs:
        return
    workers = workers_for(len(run_dirs))
    pending = list(run_dirs)
    try:
        _start_resource_tracker()
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_quiet)
    except (OSError, ValueError):  # no processes here: the caller reads the runs itself
        for path in run_dirs:
            on_built(path, False)
        return
    running: dict = {}
    try:
        while pending or running:
            while pending and len(running) < workers and not cancelled():
                path = pending.pop(0)
                running[pool.submit(build_columns, path)] = path
                on_started(path)
            if cancelled():
                return
            done, _ = wait(list(running), timeout=0.25, return_when=FIRST_COMPLETED)
            for future in done:
                path = running.pop(future)
                try:
                    ok = bool(future.result())
                except Exception:  # a process that died: the caller parses the run itself
                    ok = False
                on_built(path, ok)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
